"""Arguments into the arrays the native module reads, checked once with clear errors.

Features become CSR arrays ``(indptr int64, indices int64, data float32, n_cols)``: a scipy
sparse matrix is converted to CSR (a copy only when it is another format or dtype), a dense
array keeps its non-zeros (float64 and integer arrays are converted to float32, a copy). Labels
become ``(offsets int64, ids int64, n_labels)`` from a CSR indicator matrix or a list of label
lists. NaN and infinite values are refused by the native side, naming the row and column.
"""

from __future__ import annotations

import numbers
import os
from typing import Any, Sequence, Tuple, Union

import numpy as np

from ._errors import InvalidInput

Csr = Tuple[np.ndarray, np.ndarray, np.ndarray, int]
Labels = Tuple[np.ndarray, np.ndarray, int]


def _is_sparse(x: Any) -> bool:
    return hasattr(x, "tocsr") and hasattr(x, "nnz")


def features(x: Any, name: str = "X") -> Csr:
    """``x`` (a scipy sparse matrix or a 2-D array of numbers) as CSR arrays."""
    if _is_sparse(x):
        x = x.tocsr()
        if x.ndim != 2:
            raise InvalidInput(f"{name}: expected a 2-D matrix, got {x.ndim} dimensions")
        if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
            raise InvalidInput(f"{name}: expected real numbers, got dtype {x.dtype}")
        return (
            np.ascontiguousarray(x.indptr, dtype=np.int64),
            np.ascontiguousarray(x.indices, dtype=np.int64),
            np.ascontiguousarray(x.data, dtype=np.float32),
            int(x.shape[1]),
        )
    a = np.asarray(x)
    if a.dtype == object or not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
        raise InvalidInput(f"{name}: expected a 2-D array of numbers or a scipy sparse matrix, got dtype {a.dtype}")
    if np.issubdtype(a.dtype, np.complexfloating):
        raise InvalidInput(f"{name}: expected real numbers, got dtype {a.dtype}")
    if a.ndim != 2:
        raise InvalidInput(f"{name}: expected a 2-D array (samples x features), got shape {a.shape}")
    a = a.astype(np.float32, copy=False)
    rows, cols = np.nonzero(a)
    indptr = np.zeros(a.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=a.shape[0]), out=indptr[1:])
    return indptr, cols.astype(np.int64), np.ascontiguousarray(a[rows, cols]), int(a.shape[1])


def float32_rows(a: Any, name: str, dim: Union[int, None] = None) -> np.ndarray:
    """``a`` as a C-contiguous ``float32[n, D]`` array: read in place when it already is one;
    other float and integer arrays, Fortran-order and strided arrays are copied once (a 1-D
    array is one row). Values are checked (finite) by the native side."""
    arr = np.asarray(a)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise InvalidInput(f"{name}: expected an array of real numbers, got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2:
        raise InvalidInput(f"{name}: expected a 2-D array (rows x dimension), got shape {arr.shape}")
    if dim is not None and arr.shape[1] != dim:
        raise InvalidInput(f"{name}: rows of {arr.shape[1]} values; the index's vectors have {dim}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def labels(y: Any, n_labels: int | None = None, name: str = "Y") -> Labels:
    """``y`` (a CSR indicator matrix, or one list of label ids per sample) as offsets, ids and
    the number of labels (the matrix's columns, else ``n_labels``, else the largest id + 1)."""
    if _is_sparse(y):
        y = y.tocsr()
        return (
            np.ascontiguousarray(y.indptr, dtype=np.int64),
            np.ascontiguousarray(y.indices, dtype=np.int64),
            int(y.shape[1]),
        )
    if isinstance(y, np.ndarray) and y.ndim == 2:
        raise InvalidInput(
            f"{name}: a dense 2-D array is ambiguous; give a scipy CSR indicator matrix or a list of label lists"
        )
    offsets = [0]
    ids: list = []
    for i, row in enumerate(y):
        if isinstance(row, numbers.Integral):
            row = (row,)
        try:
            ids.extend(int(l) for l in row)
        except (TypeError, ValueError):
            raise InvalidInput(f"{name}: sample {i} is not a list of integer label ids: {row!r}") from None
        offsets.append(len(ids))
    ids_a = np.asarray(ids, dtype=np.int64)
    if ids_a.size and ids_a.min() < 0:
        raise InvalidInput(f"{name}: label ids must be >= 0, found {int(ids_a.min())}")
    k = n_labels if n_labels is not None else (int(ids_a.max()) + 1 if ids_a.size else 0)
    return np.asarray(offsets, dtype=np.int64), ids_a, k


def path(p: Any, name: str) -> str:
    """A path argument as a string."""
    if isinstance(p, (str, os.PathLike)):
        return os.fspath(p)
    raise InvalidInput(f"{name}: expected a path (str or os.PathLike), got {type(p).__name__}")


def overrides(o: Any) -> Sequence[str]:
    """``{"train.epochs": 3}`` or ``["train.epochs=3"]`` as ``key=value`` strings (TOML values)."""
    if o is None:
        return []
    if isinstance(o, dict):
        return [f"{k}={_toml_value(v)}" for k, v in o.items()]
    if isinstance(o, (list, tuple)) and all(isinstance(s, str) for s in o):
        return list(o)
    raise InvalidInput("overrides: expected a dict {key: value} or a list of 'key=value' strings")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise InvalidInput(f"overrides: value {v!r} must be a bool, number or string")
