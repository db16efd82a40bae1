"""Runs from configs: the CLI's ``train``, ``eval`` and ``compare``."""

from __future__ import annotations

import csv
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from . import _farout
from ._convert import overrides as _overrides
from ._convert import path as _path
from ._errors import InvalidInput

Config = Union[str, "os.PathLike[str]", Mapping[str, Any]]
Overrides = Union[Mapping[str, Any], Sequence[str], None]


def _source(config: Config):
    """(path, json) for the native calls."""
    if isinstance(config, Mapping):
        try:
            return None, json.dumps(config)
        except (TypeError, ValueError) as e:
            raise InvalidInput(f"config: the dict cannot be written as TOML: {e}") from None
    return _path(config, "config"), None


def train(config: Config, overrides: Overrides = None, overwrite: bool = False, resume: bool = False) -> Dict[str, Any]:
    """Trains what ``config`` describes, as ``farout train`` does, and returns the run's summary.

    ``config`` is a TOML file's path or a dict of its tables (``{"data": {...}, "linear":
    {...}}``; paths in it are relative to the working directory). ``overrides`` are ``--set``
    values: ``{"train.epochs": 3}`` or ``["train.epochs=3"]``. A run already in the config's
    directories is an error unless ``overwrite`` (replace it) or ``resume`` (continue it).
    Progress bars show when standard error is a terminal. Ctrl-C stops a network's training
    after the current step (skip-gram within its sentence) with its checkpoint saved, and raises
    ``KeyboardInterrupt`` (``resume=True`` continues it); a linear solver stops after the labels
    it is solving and keeps no model.

    >>> summary = farout.train("configs/bibtex-dismec.toml", overwrite=True)
    >>> summary["metrics"]["p@1"]
    """
    path, text = _source(config)
    out = _farout.train(path, text, list(_overrides(overrides)), bool(overwrite), bool(resume))
    return json.loads(out)


def evaluate(config: Config, overrides: Overrides = None, checkpoint: Optional[Union[str, "os.PathLike[str]"]] = None) -> Dict[str, float]:
    """The trained model's metrics on the config's test set, as ``farout eval`` prints them
    (``p@1``, ``p@3``, ``p@5``, ``ndcg@k``, ...). ``checkpoint``: a checkpoint directory other
    than the config's."""
    path, text = _source(config)
    ckpt = None if checkpoint is None else _path(checkpoint, "checkpoint")
    return json.loads(_farout.evaluate(path, text, list(_overrides(overrides)), ckpt))


def compare(
    configs: Sequence[Config],
    budget: Optional[float] = None,
    out: Optional[Union[str, "os.PathLike[str]"]] = None,
    overrides: Overrides = None,
    overwrite: bool = False,
    repeats: int = 1,
) -> List[Dict[str, Any]]:
    """Trains several configs side by side, as ``farout compare`` does, and returns one dict
    per run (the rows of ``OUT/summary.csv``; the plots are beside it). ``budget``: seconds
    of training per run (equal wall-clock budgets). ``out`` defaults to ``runs/compare``.
    Configs given as dicts are written to ``OUT/configs/<name>.toml`` first."""
    if isinstance(configs, (str, os.PathLike, Mapping)):
        raise InvalidInput("configs: expected a list of configs")
    out = "runs/compare" if out is None else _path(out, "out")
    paths = []
    for i, c in enumerate(configs):
        path, text = _source(c)
        if text is not None:
            name = str(c.get("name", f"config-{i + 1}"))
            os.makedirs(os.path.join(out, "configs"), exist_ok=True)
            path = os.path.join(out, "configs", f"{name}.toml")
            with open(path, "w", encoding="utf-8") as f:
                f.write(_farout.toml_text(text))
        paths.append(path)
    if budget is not None and not budget > 0:
        raise InvalidInput(f"budget: expected a positive number of seconds, got {budget!r}")
    if int(repeats) < 1:
        raise InvalidInput("repeats: must be >= 1")
    written = _farout.compare(paths, out, budget, list(_overrides(overrides)), bool(overwrite), int(repeats))
    with open(os.path.join(written, "summary.csv"), newline="", encoding="utf-8") as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _number(v: str) -> Any:
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v
