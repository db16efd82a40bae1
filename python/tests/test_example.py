"""examples/python/torch_ldgs.py runs where PyTorch is installed (it is not the package's
dependency), and LDGS trains the encoder as far as the exact softmax does."""

import re
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("torch")


def test_torch_example_trains_through_ldgs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "python" / "torch_ldgs.py"), "--classes", "3000", "--steps", "150"],
        capture_output=True, text=True, check=True, timeout=600,
    ).stdout
    acc = {m[0]: float(m[1]) for m in re.findall(r"^(\w+)\s+test accuracy ([0-9.]+)", out, flags=re.M)}
    assert set(acc) == {"ldgs", "softmax"}, out
    assert acc["softmax"] > 0.5, out
    assert acc["ldgs"] >= acc["softmax"] - 0.05, out
