"""Linear extreme classifiers in scikit-learn style: :class:`DiSMEC`, :class:`PPDSparse`,
:class:`MEMOIR`, with the ``[linear]`` keys of the command line as keyword arguments and the
same defaults; :class:`TfIdf` and :func:`tfidf`, the preprocessing ``data.tfidf`` and
``data.normalize`` apply on the command line (never applied behind your back); and
:func:`read_xmc`, the command line's reader of XMC and LIBSVM files.

    >>> X, Y = farout.linear.read_xmc("train.txt")
    >>> prep = farout.linear.TfIdf().fit(X)
    >>> clf = farout.linear.DiSMEC().fit(prep.transform(X), Y)
    >>> labels, scores = clf.predict(prep.transform(X_test), k=5)

A fitted model is saved with :meth:`save` as the command line's ``linear.model`` file, so it
evaluates with ``farout eval CONFIG --checkpoint DIR`` (the file at ``DIR/linear.model``), and
a model trained by ``farout train`` loads with :meth:`load`.
"""

from __future__ import annotations

import inspect
import json
import os
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _convert, _farout
from ._errors import FileError, InvalidInput

__all__ = ["DiSMEC", "PPDSparse", "MEMOIR", "TfIdf", "tfidf", "read_xmc"]

# Python names of `[linear]` keys that are Python keywords.
_KEY_OF_ARG = {"lambda_": "lambda"}


def _scipy_sparse():
    try:
        import scipy.sparse
    except ImportError:
        raise InvalidInput("this returns a scipy.sparse matrix: pip install scipy") from None
    return scipy.sparse


try:  # With scikit-learn installed, its base class gives the tags its model selection reads.
    from sklearn.base import BaseEstimator as _Base
except ImportError:  # pragma: no cover - exercised where scikit-learn is absent
    _Base = object


class _LinearClassifier(_Base):
    """What the three solvers share: parameters, fit, predict, evaluate, save and load."""

    _solver = ""

    @classmethod
    def _param_names(cls):
        return [p for p in inspect.signature(cls.__init__).parameters if p != "self"]

    def get_params(self, deep: bool = True) -> Dict[str, Any]:
        """The constructor's arguments (scikit-learn's estimator API)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> "_LinearClassifier":
        """Sets constructor arguments (scikit-learn's estimator API); unknown names are refused."""
        allowed = self._param_names()
        for name, value in params.items():
            if name not in allowed:
                raise InvalidInput(f"{type(self).__name__}: no parameter {name!r}; allowed: {', '.join(allowed)}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def _config(self) -> str:
        params = {"solver": self._solver}
        for name, value in self.get_params().items():
            if value is not None:
                params[_KEY_OF_ARG.get(name, name)] = value
        return json.dumps(params)

    def fit(self, X: Any, Y: Any) -> "_LinearClassifier":
        """Trains on features ``X`` (scipy sparse or a dense 2-D array, ``[n, d]``) and labels
        ``Y`` (a CSR indicator matrix ``[n, K]`` or one list of label ids per sample). The GIL
        is released while it trains; Ctrl-C stops it after the labels being solved and raises
        ``KeyboardInterrupt`` (the fitted model, if any, is the previous one). Returns ``self``."""
        x = _convert.features(X)
        y = _convert.labels(Y)
        self.model_ = _farout.fit_linear(self._config(), x, y)
        self.n_features_in_ = x[3]
        self.n_labels_ = self.model_.n_labels
        return self

    def _fitted(self):
        model = getattr(self, "model_", None)
        if model is None:
            raise InvalidInput(f"this {type(self).__name__} is not fitted: call fit(X, Y) or load(path) first")
        return model

    def predict(self, X: Any, k: int = 5) -> Tuple[np.ndarray, np.ndarray]:
        """The ``k`` best labels of every row of ``X``, best first: ``(labels int64[n, k],
        scores float32[n, k])`` (``k`` is capped at the number of labels)."""
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise InvalidInput(f"k: expected an integer >= 1, got {k!r}")
        return self._fitted().predict(_convert.features(X), int(k))

    def evaluate(self, X: Any, Y: Any) -> Dict[str, float]:
        """P@1/3/5 and nDCG@1/3/5 (accuracy for single-label data) on ``X`` with labels ``Y``,
        computed as ``farout eval`` computes them."""
        model = self._fitted()
        return json.loads(model.evaluate(_convert.features(X), _convert.labels(Y, model.n_labels)))

    def score(self, X: Any, Y: Any) -> float:
        """P@1 on ``X`` with labels ``Y`` (what scikit-learn's model selection maximises)."""
        return self.evaluate(X, Y)["p@1"]

    @property
    def fit_summary_(self) -> Optional[Dict[str, Any]]:
        """What the solver reported: seconds, threads, non-zeros before and after pruning,
        its own statistics (None for a loaded model)."""
        s = self._fitted().summary
        return None if s is None else json.loads(s)

    def save(self, path: Any, overwrite: bool = False) -> None:
        """Writes the model file ``farout train`` writes (``DIR/linear.model`` is what
        ``farout eval CONFIG --checkpoint DIR`` reads). An existing file is an error unless
        ``overwrite``."""
        path = _convert.path(path, "path")
        if os.path.isdir(path):
            raise FileError(f"{path} is a directory: name the model file (e.g. {os.path.join(path, 'linear.model')})")
        if os.path.exists(path) and not overwrite:
            raise FileError(f"{path} exists; pass overwrite=True to replace it")
        self._fitted().save(path)

    @classmethod
    def load(cls, path: Any) -> "_LinearClassifier":
        """Reads a model file written by :meth:`save` or by ``farout train``. The parameters of
        the returned classifier are the defaults (the file holds the weights only)."""
        self = cls()
        self.model_ = _farout.LinearModel.load(_convert.path(path, "path"))
        self.n_features_in_ = self.model_.n_features
        self.n_labels_ = self.model_.n_labels
        return self

    @property
    def nnz_(self) -> int:
        """Non-zero weights of the fitted model (biases included)."""
        return self._fitted().nnz


class DiSMEC(_LinearClassifier):
    """DiSMEC: one L2-regularised squared-hinge classifier per label, trained by truncated
    Newton, weights below ``prune_threshold`` pruned (Babbar and Schölkopf, 2017).

    Parameters are the ``[linear]`` keys of ``solver = "dismec"`` (docs/config.md): ``c`` the
    loss weight, ``eps0`` Newton's tolerance, ``max_iter`` Newton iterations per label,
    ``bias`` a constant feature, ``prune_threshold``, ``init`` (``"zero"``, ``"bias"``,
    ``"msi"``), ``bias_init``, ``msi_s``, ``msi_t``."""

    _solver = "dismec"

    def __init__(
        self,
        c: float = 1.0,
        eps0: float = 0.01,
        max_iter: int = 1000,
        bias: bool = True,
        prune_threshold: float = 0.01,
        init: str = "msi",
        bias_init: float = 1.0,
        msi_s: float = 1.0,
        msi_t: float = -2.0,
    ):
        self.c = c
        self.eps0 = eps0
        self.max_iter = max_iter
        self.bias = bias
        self.prune_threshold = prune_threshold
        self.init = init
        self.bias_init = bias_init
        self.msi_s = msi_s
        self.msi_t = msi_t


class PPDSparse(_LinearClassifier):
    """PPDSparse: primal-dual sparse one-vs-all with an active set found by sparsified search
    (Yen et al., 2017). ``lambda_`` is the ``[linear]`` key ``lambda`` (ℓ1 weight); the
    others keep their names: ``tau``, ``kappa``, ``min_kappa``, ``max_iter``,
    ``inner_sweeps``, ``delta``, ``column_threshold``, ``tol``, ``bias``,
    ``prune_threshold``, ``seed`` (docs/config.md)."""

    _solver = "ppdsparse"

    def __init__(
        self,
        lambda_: float = 0.03,
        tau: float = 1.0,
        kappa: int = 0,
        min_kappa: int = 256,
        max_iter: int = 100,
        inner_sweeps: int = 3,
        delta: float = 1.0,
        column_threshold: float = 0.0,
        tol: float = 0.1,
        bias: bool = True,
        prune_threshold: float = 0.01,
        seed: int = 0,
    ):
        self.lambda_ = lambda_
        self.tau = tau
        self.kappa = kappa
        self.min_kappa = min_kappa
        self.max_iter = max_iter
        self.inner_sweeps = inner_sweeps
        self.delta = delta
        self.column_threshold = column_threshold
        self.tol = tol
        self.bias = bias
        self.prune_threshold = prune_threshold
        self.seed = seed


class MEMOIR(_LinearClassifier):
    """MEMOIR: a multiclass SVM trained by stochastic subgradient with the argmax found by a
    MIPS index (the oracle), for single-label data. ``oracle`` is the ``[linear.oracle]``
    table as a dict (``{"kind": "flat_int8"}``; None: the default); ``lambda_`` is the key
    ``lambda``; the others keep their names: ``variant`` (``"l2"``, ``"l1"``), ``eta0``,
    ``eta_step``, ``batch``, ``batches``, ``epochs``, ``seed``, ``rebuild_fraction``,
    ``prune_threshold``, ``monitor`` (docs/config.md)."""

    _solver = "memoir"

    def __init__(
        self,
        variant: str = "l2",
        oracle: Optional[Dict[str, Any]] = None,
        eta0: float = 0.1,
        eta_step: float = 0.02,
        batch: int = 0,
        lambda_: float = 0.0,
        batches: int = 25,
        epochs: int = 0,
        seed: int = 1,
        rebuild_fraction: float = 0.5,
        prune_threshold: float = 0.0,
        monitor: int = 1000,
    ):
        self.variant = variant
        self.oracle = oracle
        self.eta0 = eta0
        self.eta_step = eta_step
        self.batch = batch
        self.lambda_ = lambda_
        self.batches = batches
        self.epochs = epochs
        self.seed = seed
        self.rebuild_fraction = rebuild_fraction
        self.prune_threshold = prune_threshold
        self.monitor = monitor


class TfIdf(_Base):
    """The command line's feature preprocessing: each column scaled by its smoothed idf
    ``ln((1 + N)/(1 + df)) + 1`` fitted on the training rows (``data.tfidf``), then each row
    scaled to unit L2 norm (``data.normalize``). Fit it on the training set, transform every
    split. Works in scikit-learn pipelines."""

    def __init__(self, tfidf: bool = True, normalize: bool = True):
        self.tfidf = tfidf
        self.normalize = normalize

    def get_params(self, deep: bool = True) -> Dict[str, Any]:
        return {"tfidf": self.tfidf, "normalize": self.normalize}

    def set_params(self, **params: Any) -> "TfIdf":
        for name, value in params.items():
            if name not in ("tfidf", "normalize"):
                raise InvalidInput(f"TfIdf: no parameter {name!r}; allowed: tfidf, normalize")
            setattr(self, name, value)
        return self

    def fit(self, X: Any, Y: Any = None) -> "TfIdf":
        """Fits the idf weights on ``X``; ``idf_`` holds them (None without ``tfidf``)."""
        x = _convert.features(X)
        self.idf_ = _farout.fit_idf(x) if self.tfidf else None
        self.n_features_in_ = x[3]
        return self

    def transform(self, X: Any) -> Any:
        """``X`` weighted and normalised, as a new ``scipy.sparse.csr_matrix`` (float32)."""
        if not hasattr(self, "n_features_in_"):
            raise InvalidInput("this TfIdf is not fitted: call fit(X) first")
        sparse = _scipy_sparse()
        x = _convert.features(X)
        if x[3] != self.n_features_in_:
            raise InvalidInput(f"X has {x[3]} features; TfIdf was fitted on {self.n_features_in_}")
        indptr, indices, data = _farout.transform(x, self.idf_, bool(self.normalize))
        return sparse.csr_matrix((data, indices, indptr), shape=(len(indptr) - 1, x[3]))

    def fit_transform(self, X: Any, Y: Any = None) -> Any:
        return self.fit(X).transform(X)


def tfidf(X: Any, normalize: bool = True) -> Any:
    """``TfIdf(normalize=normalize).fit_transform(X)``: ``X`` weighted by its own idf."""
    return TfIdf(normalize=normalize).fit_transform(X)


def read_xmc(path: Any) -> Tuple[Any, Any]:
    """Reads an Extreme Classification Repository file (``N D K`` header, then ``l1,l2 f:v
    ...`` lines) or a LIBSVM file, as ``farout train`` does: ``(X, Y)``, features as a
    ``scipy.sparse.csr_matrix`` (float32) and labels as a CSR indicator matrix. Malformed
    lines raise :class:`farout.InvalidInput` naming the file and line."""
    sparse = _scipy_sparse()
    (indptr, indices, data), n_cols, offsets, ids, n_labels = _farout.read_xmc(_convert.path(path, "path"))
    n = len(indptr) - 1
    x = sparse.csr_matrix((data, indices, indptr), shape=(n, n_cols))
    y = sparse.csr_matrix((np.ones(len(ids), dtype=np.float32), ids, offsets), shape=(n, n_labels))
    return x, y
