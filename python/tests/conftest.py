"""Shared fixtures: the repository's root, the public data sets, the command-line binary."""

import os
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def data_dir():
    """$FAROUT_DATA, else ../shared/data beside the repository (None if neither exists)."""
    for d in (os.environ.get("FAROUT_DATA"), ROOT.parent / "shared" / "data"):
        if d and pathlib.Path(d).is_dir():
            return pathlib.Path(d)
    return None


@pytest.fixture
def bibtex():
    d = data_dir()
    if d is None or not (d / "xmc" / "bibtex" / "train.txt").exists():
        pytest.skip("Bibtex is not in $FAROUT_DATA (or ../shared/data)")
    os.environ.setdefault("FAROUT_DATA", str(d))
    return d / "xmc" / "bibtex"


@pytest.fixture
def farout_cli():
    """The `farout` binary: $FAROUT_BIN, the workspace's release build, or one on PATH."""
    for c in (os.environ.get("FAROUT_BIN"), ROOT / "target" / "release" / "farout", shutil.which("farout")):
        if c and pathlib.Path(c).is_file():
            return str(c)
    pytest.skip("the farout binary is not built (cargo build --release)")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Runs the test in a fresh directory (runs/ and checkpoints go there)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
