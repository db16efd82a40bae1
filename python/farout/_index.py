"""A maximum inner product search index, FAISS style: :class:`Index`."""

from __future__ import annotations

import json
import os
from typing import Any, Tuple, Union

import numpy as np

from . import _farout
from ._convert import float32_rows
from ._convert import path as _path
from ._errors import InvalidInput

__all__ = ["Index"]

# Index kinds whose probe budget calibrates to a target recall (the others take no `recall`).
_CALIBRATED = ("auto", "spherical")
_DEFAULT_RECALL = 0.9


class Index:
    """Top-k maximum inner product search over the rows of a ``float32[K, D]`` array.

    ``kind`` is any index of ``[index] kind`` (``"auto"``, the default: spherical clustering
    where it cuts the search, int8 brute force where not, brute force below 2,000 rows;
    ``"spherical"``, ``"flat_int8"``, ``"simple_lsh"``, ``"hamming"``, ``"hnsw"``,
    ``"exact"``), ``recall`` the target recall the calibrated kinds (auto, spherical) fit their
    probe budget to, and ``params`` any other ``[index]`` key of that kind
    (``n_centroids=400``, ``candidate_factor=10``, ...). Scores are exact inner products.

    The index keeps its own copy of ``vectors`` (copied once, converted to float32 if needed);
    queries that are C-contiguous float32 are read in place. The GIL is released while it
    builds and searches.

    >>> index = farout.Index(vectors, kind="auto", recall=0.9)
    >>> ids, scores = index.search(queries, k=10)          # int64[n, 10], float32[n, 10]
    >>> index.update([3, 7], new_rows)                     # re-indexes those two rows
    >>> index.save("vectors.index"); index = farout.Index.load("vectors.index")
    """

    def __init__(self, vectors: Any, kind: str = "auto", recall: float = _DEFAULT_RECALL, **params: Any) -> None:
        if not isinstance(kind, str):
            raise InvalidInput(f"kind: expected a string such as \"auto\", got {kind!r}")
        settings = {"kind": kind, **params}
        if kind in _CALIBRATED:
            settings["recall"] = float(recall)
        elif recall != _DEFAULT_RECALL:
            raise InvalidInput(f"recall: the {kind!r} index does not calibrate to a recall (only {', '.join(_CALIBRATED)} do)")
        try:
            text = json.dumps(settings)
        except (TypeError, ValueError) as e:
            raise InvalidInput(f"index parameters: {e}") from None
        self._native = _farout.NativeIndex(float32_rows(vectors, "vectors"), text)

    @classmethod
    def load(cls, path: Union[str, "os.PathLike[str]"]) -> "Index":
        """Reads an index saved by :meth:`save` (or ``farout index --with-vectors``) without
        building it again; it answers as the saved index did."""
        index = cls.__new__(cls)
        index._native = _farout.NativeIndex.load(_path(path, "path"))
        return index

    def save(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes the index, its parameters and its vectors to ``path`` (farout's index file:
        versioned, checksummed, replaced atomically). ``"hnsw"`` indexes cannot be saved."""
        self._native.save(_path(path, "path"))

    def search(self, queries: Any, k: int = 10) -> Tuple[np.ndarray, np.ndarray]:
        """Ids ``int64[n, k]`` and scores ``float32[n, k]`` of the ``k`` rows with the largest
        inner product with each query (``float32[n, D]``; a 1-D array is one query), best first.
        An approximate index may find fewer than ``k`` rows: the rest are ``-1`` and ``-inf``.
        The spherical index (and ``"auto"`` while it uses one) scores a query searched alone on
        4-bit codes of the vectors, which it makes at the first such call (0.15-0.3 s per
        200,000 vectors of 128 values on 2 cores) and keeps up to date from then on."""
        return self._native.search(float32_rows(queries, "queries", self.dim), _count(k, "k"))

    def update(self, ids: Any, rows: Any) -> None:
        """Replaces the vectors ``ids`` (distinct, in range) by ``rows`` (``float32[len(ids), D]``)
        and re-indexes only those rows, as training refreshes its index; an index that asks to be
        rebuilt (a row outgrew its norm bound) is rebuilt with the same parameters."""
        ids_a = np.asarray(ids)
        if ids_a.ndim == 0:
            ids_a = ids_a.reshape(1)
        if ids_a.ndim != 1 or not (np.issubdtype(ids_a.dtype, np.integer) or ids_a.size == 0):
            raise InvalidInput(f"ids: expected a 1-D array of integers, got dtype {ids_a.dtype} and shape {ids_a.shape}")
        rows_a = float32_rows(rows, "rows", self.dim)
        self._native.update(np.ascontiguousarray(ids_a, dtype=np.int64), rows_a)

    def recall(self, queries: Any, k: int = 10) -> float:
        """Mean share of each query's exact top ``k`` (brute force) that :meth:`search` finds."""
        return self._native.recall(float32_rows(queries, "queries", self.dim), _count(k, "k"))

    def __len__(self) -> int:
        return len(self._native)

    @property
    def dim(self) -> int:
        """Dimension D of the vectors."""
        return self._native.dim

    @property
    def kind(self) -> str:
        """The index answering (``"auto"``, ``"spherical"``, ``"exact"``, ...)."""
        return self._native.kind

    @property
    def params(self) -> dict:
        """The ``[index]`` parameters it was built from, with their defaults."""
        return json.loads(self._native.params)

    @property
    def vectors(self) -> np.ndarray:
        """A copy of the indexed vectors, ``float32[K, D]``."""
        return self._native.vectors()

    def __repr__(self) -> str:
        return f"farout.Index(kind={self.kind!r}, rows={len(self)}, dim={self.dim})"


def _count(k: Any, name: str) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InvalidInput(f"{name}: expected an integer, got {k!r}")
    return int(k)
