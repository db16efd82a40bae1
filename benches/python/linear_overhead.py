"""Python against the command line on the same linear fit: `farout train CONFIG` (its
`train_seconds`, the solver's wall time) and `DiSMEC/PPDSparse(...).fit` from Python on the same
data and preprocessing, alternated `--repeats` times. Prints the seconds of each and the ratio.

    python benches/python/linear_overhead.py configs/delicious-dismec.toml --repeats 3
"""

import argparse
import json
import os
import pathlib
import subprocess
import tempfile
import time
import tomllib

import farout
from farout import linear

ROOT = pathlib.Path(__file__).resolve().parents[2]


def expand(p):
    return p.replace("$FAROUT_DATA", os.environ.get("FAROUT_DATA", str(ROOT.parent / "shared" / "data")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cli", default=str(ROOT / "target" / "release" / "farout"))
    args = ap.parse_args()
    cfg = tomllib.loads(pathlib.Path(args.config).read_text())
    params = dict(cfg["linear"])
    cls = {"dismec": linear.DiSMEC, "ppdsparse": linear.PPDSparse, "memoir": linear.MEMOIR}[params.pop("solver")]
    params = {("lambda_" if k == "lambda" else k): v for k, v in params.items()}
    X, Y = linear.read_xmc(expand(cfg["data"]["train"]))
    prep = linear.TfIdf(tfidf=cfg["data"].get("tfidf", False), normalize=cfg["data"].get("normalize", True)).fit(X)
    Xp = prep.transform(X)
    cli, py = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            out = subprocess.run(
                [args.cli, "train", os.path.abspath(args.config), "--overwrite"],
                cwd=tmp, capture_output=True, text=True, check=True,
            )
            cli.append(json.loads(out.stdout)["train_seconds"])
            t0 = time.perf_counter()
            clf = cls(**params).fit(Xp, Y)
            py.append(time.perf_counter() - t0)
            print(f"run {r + 1}: CLI {cli[-1]:.2f} s, Python {py[-1]:.2f} s")
    print(f"best: CLI {min(cli):.2f} s, Python {min(py):.2f} s, ratio {min(py) / min(cli):.3f}")


if __name__ == "__main__":
    main()
