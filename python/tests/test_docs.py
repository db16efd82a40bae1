"""Every ```python block of docs/python.md and of the README's "From Python" section runs."""

import re

import numpy as np
import pytest

import farout
from conftest import ROOT


def blocks(path):
    text = path.read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


DOCS = [(p.name, i, code) for p in (ROOT / "docs" / "python.md", ROOT / "README.md") for i, code in enumerate(blocks(p))]


@pytest.mark.parametrize("name,i,code", DOCS, ids=[f"{n}-{i}" for n, i, _ in DOCS])
def test_example_runs(name, i, code, in_tmp):
    if "scipy" in code:
        pytest.importorskip("scipy")
    if "torch" in code:
        pytest.importorskip("torch")
    exec(compile(code, f"{name} block {i}", "exec"), {"farout": farout, "np": np})


def test_the_docs_have_examples():
    assert len([d for d in DOCS if d[0] == "python.md"]) >= 5
