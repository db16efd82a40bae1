"""Word vectors, gensim style: :class:`KeyedVectors` and :func:`train_word_vectors`."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from . import _farout
from ._convert import path as _path
from ._errors import InvalidInput
from ._convert import float32_rows

__all__ = ["KeyedVectors", "train_word_vectors"]

PathLike = Union[str, "os.PathLike[str]"]


class KeyedVectors:
    """Words and their vectors: ``kv["word"]``, :meth:`most_similar`, :meth:`similarity` and
    the evaluations of ``farout eval``.

    :meth:`load` reads word2vec text files, word2vec binary files (``.bin``) and farout's
    ``.model`` files; a ``.model`` trained with subwords (``maxn > 0``) gives words outside the
    vocabulary the mean of their character n-grams' vectors, as fastText does.
    :meth:`most_similar` searches by cosine through farout's index: exactly by brute force for
    the first 256 queries, then through the automatic index (itself brute force below 2,000
    words), built once; the GIL is released while it searches.

    >>> kv = farout.KeyedVectors.load("vectors.bin")
    >>> kv.most_similar("king", topn=5)      # [("queen", 0.71), ...]
    >>> kv.similarity("king", "queen")
    """

    def __init__(self, words: List[str], vectors: Any) -> None:
        """Vectors from a list of distinct words (no whitespace) and ``float32[len(words), D]``."""
        words = [str(w) for w in words]
        self._native = _farout.NativeVectors.from_arrays(words, float32_rows(vectors, "vectors"))
        self._words: Optional[List[str]] = None

    @classmethod
    def _wrap(cls, native: Any) -> "KeyedVectors":
        kv = cls.__new__(cls)
        kv._native, kv._words = native, None
        return kv

    @classmethod
    def load(cls, path: PathLike) -> "KeyedVectors":
        """Reads ``path``: farout's model for ``.model``, word2vec binary for ``.bin``, else
        word2vec text. NaN and infinite values are refused, naming the word."""
        return cls._wrap(_farout.NativeVectors.load(_path(path, "path")))

    def save(self, path: PathLike) -> None:
        """Writes the vectors in the format ``path``'s extension names (see :meth:`load`)."""
        self._native.save(_path(path, "path"))

    @property
    def index_to_key(self) -> List[str]:
        """The words, in file order (most frequent first for files farout writes)."""
        if self._words is None:
            self._words = self._native.words()
        return self._words

    @property
    def vectors(self) -> np.ndarray:
        """A copy of the vectors, ``float32[len(self), D]``."""
        return self._native.vectors()

    @property
    def vector_size(self) -> int:
        """Dimension D."""
        return self._native.dim

    @property
    def has_ngrams(self) -> bool:
        """Whether words outside the vocabulary get vectors from character n-grams."""
        return self._native.has_ngrams

    def __len__(self) -> int:
        return len(self._native)

    def __contains__(self, word: str) -> bool:
        return self._native.index_of(str(word)) is not None

    def get_index(self, word: str) -> int:
        """Row of ``word``; ``KeyError`` outside the vocabulary."""
        i = self._native.index_of(str(word))
        if i is None:
            raise KeyError(f"{word!r} is not in the vocabulary")
        return i

    def __getitem__(self, word: str) -> np.ndarray:
        """The vector of ``word`` (``float32[D]``): its own, or from its n-grams outside the
        vocabulary; ``KeyError`` when it has neither."""
        v = self._native.vector(str(word))
        if v is None:
            why = "and has no character n-gram in the model" if self.has_ngrams else "(the vectors have no n-gram rows)"
            raise KeyError(f"{word!r} is not in the vocabulary {why}")
        return v

    def most_similar(
        self,
        positive: Any = None,
        negative: Any = None,
        topn: int = 10,
    ) -> List[Tuple[str, float]]:
        """The ``topn`` words nearest a query by cosine, best first, as ``(word, cosine)`` pairs.

        As gensim's: the query is the mean of the unit vectors of the ``positive`` words minus
        those of the ``negative`` words (``most_similar(positive=["king", "woman"],
        negative=["man"])`` answers an analogy), and the words given are left out of the
        answer. Each of ``positive`` and ``negative`` is a word, a vector ``float32[D]`` (taken as
        it is, not normalised) or a list of them; an entry may be a ``(word_or_vector, weight)``
        pair. A word outside the vocabulary takes its n-grams' vector when the model has them.
        """
        if isinstance(topn, bool) or not isinstance(topn, (int, np.integer)) or topn < 1:
            raise InvalidInput(f"topn: expected an integer >= 1, got {topn!r}")
        terms = self._terms(positive, 1.0, "positive") + self._terms(negative, -1.0, "negative")
        if not terms:
            raise InvalidInput("most_similar: give at least one positive or negative word or vector")
        parts, exclude = [], []
        for term, weight in terms:
            if isinstance(term, str):
                v = self[term].astype(np.float64)
                norm = np.linalg.norm(v)
                parts.append(weight * (v / norm if norm > 0 else v))
                if term in self:
                    exclude.append(self.get_index(term))
            else:
                q = float32_rows(term, "query", self.vector_size)
                if q.shape[0] != 1:
                    raise InvalidInput(f"query: expected one vector, got {q.shape[0]} rows")
                parts.append(weight * q[0].astype(np.float64))
        query = np.mean(parts, axis=0).astype(np.float32)[None, :]
        ids, scores = self._native.most_similar(query, [sorted(set(exclude))], int(topn))
        words = self.index_to_key
        return [(words[i], float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]

    @staticmethod
    def _terms(given: Any, weight: float, name: str) -> List[Tuple[Any, float]]:
        """``given`` (``None``, a word, a vector, or a list of them or of ``(term, weight)``
        pairs) as a list of ``(term, weight)``, every weight multiplied by ``weight`` (-1 for
        the negative terms)."""
        if given is None:
            return []
        if isinstance(given, str) or (isinstance(given, np.ndarray) and given.ndim == 1):
            return [(given, weight)]
        if isinstance(given, np.ndarray):
            raise InvalidInput(f"{name}: expected one vector float32[D] or a list, got an array of shape {given.shape}")
        out = []
        for item in given:
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], (int, float, np.number)):
                out.append((item[0], weight * float(item[1])))
            else:
                out.append((item, weight))
        return out

    def similarity(self, a: str, b: str) -> float:
        """Cosine similarity of the vectors of words ``a`` and ``b`` (0 when one is zero)."""
        x, y = self[a].astype(np.float64), self[b].astype(np.float64)
        nx, ny = np.linalg.norm(x), np.linalg.norm(y)
        return float(x @ y / (nx * ny)) if nx > 0 and ny > 0 else 0.0

    def evaluate_word_pairs(self, path: PathLike) -> Dict[str, Any]:
        """Spearman and Pearson correlations of cosines with a word-pair file's scores
        (WordSim-353 format), as ``farout eval similarity``: ``spearman``, ``pearson``,
        ``pairs``, ``skipped``, ``oov``."""
        return json.loads(self._native.evaluate_word_pairs(_path(path, "path")))

    def evaluate_analogies(self, path: PathLike, restrict: int = 30000) -> Dict[str, Any]:
        """Accuracy on an analogy file (``questions-words.txt`` format) over the ``restrict``
        most frequent words (0: all), as ``farout eval analogy``."""
        return json.loads(self._native.evaluate_analogies(_path(path, "path"), int(restrict)))

    def __repr__(self) -> str:
        return f"farout.KeyedVectors(words={len(self)}, dim={self.vector_size}, ngrams={self.has_ngrams})"


def train_word_vectors(
    corpus: PathLike,
    epochs: int = 5,
    min_count: int = 5,
    estimator: str = "negative_sampling",
    threads: int = 0,
    seed: int = 1,
    **params: Any,
) -> KeyedVectors:
    """Trains skip-gram (or CBOW) word vectors on the text file ``corpus`` as ``farout train``
    does with a skip-gram config, and returns them. ``params`` are the ``[model.skip_gram]``
    keys (``dim=100``, ``window=5``, ``lr``, ``mode="cbow"``, ``minn``/``maxn`` for subword
    vectors, ...); ``estimator`` is ``[output] estimator``. The run's files go to a temporary
    directory, removed afterwards. Ctrl-C stops it within a sentence (``KeyboardInterrupt``, no
    vectors kept).

    >>> kv = farout.train_word_vectors("corpus.txt", dim=50, epochs=3, min_count=2)
    """
    with tempfile.TemporaryDirectory(prefix="farout-vectors-") as tmp:
        config = {
            "name": "word_vectors",
            "seed": int(seed),
            "data": {"format": "text", "corpus": os.path.abspath(_path(corpus, "corpus")), "text": {"min_count": int(min_count)}},
            "model": {"encoder": "skip_gram", "skip_gram": dict(params)},
            "output": {"estimator": estimator},
            "train": {"epochs": int(epochs), "threads": int(threads)},
            "log": {"dir": os.path.join(tmp, "run")},
            # The run's directory is removed afterwards: nothing could resume from a checkpoint.
            "checkpoint": {"enabled": False},
        }
        try:
            text = json.dumps(config)
        except (TypeError, ValueError) as e:
            raise InvalidInput(f"word vectors: {e}") from None
        try:
            native = _farout.train_word_vectors(text, os.path.join(tmp, "vectors.model"))
        except KeyboardInterrupt:
            raise KeyboardInterrupt("train_word_vectors stopped on request; no vectors were kept") from None
        return KeyedVectors._wrap(native)
