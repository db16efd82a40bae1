"""farout's output layer for a training loop written in any framework."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from . import _convert, _farout
from ._errors import InvalidInput


def _matrix(x: Any, name: str) -> np.ndarray:
    """``x`` as C-contiguous ``float32[B, dim]`` features: a batch is 2-D, never one row."""
    if np.ndim(x) != 2:
        raise InvalidInput(f"{name}: expected a 2-D array [batch, dim], got shape {np.shape(x)}")
    return _convert.float32_rows(x, name)


class OutputLayer:
    """The output layer ``z = W φ + b`` of ``n_classes`` classes over ``dim``-dimensional
    features, trained by farout's gradient estimators.

    ``estimator`` and ``**params`` are the ``[output]`` keys of a config (docs/config.md):
    ``"softmax"`` and ``"margin"`` are exact; ``"ldgs"`` (the default), ``"mips"``,
    ``"sampled_softmax"``, ``"negative_sampling"``, ... estimate the gradient in time sublinear
    in ``n_classes``. ``loss``: the loss a search estimator approximates (``"margin"`` or
    ``"softmax"``; None: the estimator's default). ``optimizer``: the ``[output.optimizer]``
    table (default ``{"kind": "adagrad", "lr": 0.1}``); ``layer``: ``[output.layer]`` (bias,
    initialisation); ``index``: the ``[index]`` table of the search estimators (default: the
    ``auto`` index at recall 0.9). ``label_counts``: training label counts per class, for the
    ``unigram`` proposal of the sampling estimators.

        >>> layer = farout.OutputLayer(100_000, 128, estimator="ldgs")
        >>> loss, grad = layer.step(features, labels)   # float32 [B, 128], int [B]
    """

    def __init__(
        self,
        n_classes: int,
        dim: int,
        estimator: str = "ldgs",
        loss: Optional[str] = None,
        optimizer: Optional[Dict[str, Any]] = None,
        layer: Optional[Dict[str, Any]] = None,
        index: Optional[Dict[str, Any]] = None,
        seed: int = 1,
        label_counts: Optional[Sequence[int]] = None,
        **params: Any,
    ):
        for name, v in (("n_classes", n_classes), ("dim", dim)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InvalidInput(f"{name}: expected an integer >= 1, got {v!r}")
        output: Dict[str, Any] = {"estimator": estimator, **params}
        if loss is not None:
            output["loss"] = loss
        if optimizer is not None:
            output["optimizer"] = optimizer
        if layer is not None:
            output["layer"] = layer
        spec = {"n_classes": int(n_classes), "dim": int(dim), "seed": int(seed), "output": output, "index": index}
        counts = None if label_counts is None else [int(c) for c in label_counts]
        self._layer = _farout.OutputLayer(json.dumps(spec), counts)

    @classmethod
    def _wrap(cls, native) -> "OutputLayer":
        self = cls.__new__(cls)
        self._layer = native
        return self

    @property
    def n_classes(self) -> int:
        return json.loads(self._layer.spec)["n_classes"]

    @property
    def dim(self) -> int:
        return json.loads(self._layer.spec)["dim"]

    def _labels(self, labels: Any):
        if isinstance(labels, np.ndarray) and labels.ndim == 1 or (
            hasattr(labels, "__len__") and len(labels) and all(isinstance(l, (int, np.integer)) for l in labels)
        ):
            ids = np.asarray(labels)
            if not np.issubdtype(ids.dtype, np.integer):
                raise InvalidInput(f"labels: expected integer class ids, got dtype {ids.dtype}")
            ids = np.ascontiguousarray(ids, dtype=np.int64)
            return np.arange(len(ids) + 1, dtype=np.int64), ids
        offsets, ids, _ = _convert.labels(labels, self.n_classes, name="labels")
        return offsets, ids

    def step(self, features: Any, labels: Any) -> Tuple[float, np.ndarray]:
        """One training step: ``features`` ``float32[B, dim]`` (other float dtypes and F-order
        are converted, a copy) and ``labels`` (an int array ``[B]`` for single-label data, or
        one list of class ids per sample). Returns the batch's mean loss and ``dL/dφ``
        ``float32[B, dim]`` (the gradient of the summed loss), and updates the rows of W that
        carry gradient and the index. The GIL is released while it computes."""
        offsets, ids = self._labels(labels)
        return self._layer.step(_matrix(features, "features"), offsets, ids)

    def scores(self, features: Any, k: int = 10) -> Tuple[np.ndarray, np.ndarray]:
        """The ``k`` best classes of every row by exact score, best first: ``(ids int64[B, k],
        scores float32[B, k])``."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise InvalidInput(f"k: expected an integer >= 1, got {k!r}")
        return self._layer.scores(_matrix(features, "features"), int(k))

    @property
    def weights(self) -> np.ndarray:
        """W as a new ``float32[n_classes, dim]`` array (a copy)."""
        return self._layer.weights

    @property
    def bias(self) -> Optional[np.ndarray]:
        """The bias (a copy), or None for a layer without one."""
        return self._layer.bias

    @property
    def steps(self) -> int:
        """Training steps taken."""
        return self._layer.steps

    @property
    def estimator(self) -> str:
        """The estimator computing the gradient (``"ldgs"``, ``"softmax"``, ...)."""
        return self._layer.estimator

    def save(self, path: Any) -> None:
        """Writes W, the bias, the optimiser's state, the index once built (not ``hnsw``'s) and
        the layer's settings into the directory ``path``."""
        self._layer.save(_convert.path(path, "path"))

    @classmethod
    def load(cls, path: Any) -> "OutputLayer":
        """Reads a layer written by :meth:`save`; training continues where it stopped, with the
        index it had (a layer saved without one builds it at its next step)."""
        return cls._wrap(_farout.OutputLayer.load(_convert.path(path, "path")))

    def __repr__(self) -> str:
        return f"OutputLayer(n_classes={self.n_classes}, dim={self.dim}, estimator={self.estimator!r})"
