"""farout: learning with huge output spaces, from Python.

- :func:`train`, :func:`evaluate`, :func:`compare`: the command line's runs, from a config
  file or a dict;
- :mod:`farout.linear`: DiSMEC, PPDSparse and MEMOIR in scikit-learn style, with tf-idf and
  the XMC / LIBSVM reader;
- :class:`OutputLayer`: the output layer and its gradient estimators (LDGS, ...) for a
  training loop written in any framework;
- :class:`Index`: maximum inner product search, FAISS style, saved and loaded without
  rebuilding;
- :class:`KeyedVectors`, :func:`train_word_vectors`: word vectors, gensim style;
- :class:`FaroutError` (and :class:`InvalidInput`, a ``ValueError``; :class:`FileError`, an
  ``OSError``): every error farout raises, with the command line's message.

The reference with runnable examples is docs/python.md in the repository.
"""

from . import _farout
from ._errors import FaroutError, FileError, InvalidInput
from ._layer import OutputLayer
from ._index import Index
from ._runs import compare, evaluate, train
from ._vectors import KeyedVectors, train_word_vectors
from . import linear

__version__ = _farout.__version__


def set_verbosity(level: str) -> None:
    """Which of farout's log lines reach standard error: ``"warning"`` (the default),
    ``"info"`` (what the command line prints) or ``"off"``."""
    _farout.set_verbosity(level)


__all__ = [
    "FaroutError",
    "FileError",
    "Index",
    "InvalidInput",
    "KeyedVectors",
    "OutputLayer",
    "compare",
    "evaluate",
    "linear",
    "set_verbosity",
    "train",
    "train_word_vectors",
]
