#!/usr/bin/env python3
"""farout.Index from Python beside FAISS and ScaNN from Python, on the vectors farout
searched: recall@Q against exact search and queries per second, batched (256 queries per call)
and one query at a time, with the same timing and recall code as search_peers.py (whose rows
give the peers); and the per-call cost of one query through the Python binding.

Installs nothing. Needs a venv with the package and the peers:
    python3 -m venv /tmp/pyidx-venv && /tmp/pyidx-venv/bin/pip install ./python faiss-cpu scann numpy
and vectors written by farout:
    farout bench search --k 200000 --d 128 --top 100 --queries 1000 --export DIR
Run (threads through RAYON_NUM_THREADS for farout, --threads for the peers):
    RAYON_NUM_THREADS=2 /tmp/pyidx-venv/bin/python benches/peers/python_index.py DIR --top 100
    /tmp/pyidx-venv/bin/python benches/peers/search_peers.py DIR --top 100 --tools faiss-sq8,faiss-ivf,faiss-hnsw,scann

Rows (JSON): tool "farout-py", params (the kind and what it calibrated), recall, qps, qps_single,
build_s; then one row "overhead" with the microseconds per call of `Index.search` on one query
over one row (the binding's own cost: argument checks, GIL release, array allocation) and of
the same search on this index alone.
"""
import argparse, json, os, sys, time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from search_peers import exact_top, recall, row, timed  # noqa: E402

import farout  # noqa: E402


def overhead(d, calls=20_000):
    """Microseconds per `search` of one query on a one-row exact index: the binding's cost."""
    index = farout.Index(np.ones((1, d), dtype=np.float32), kind="exact")
    q = np.ones((1, d), dtype=np.float32)
    for _ in range(1_000):
        index.search(q, 1)
    t = time.perf_counter()
    for _ in range(calls):
        index.search(q, 1)
    return 1e6 * (time.perf_counter() - t) / calls


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir")
    p.add_argument("--top", type=int, default=100)
    p.add_argument("--single", type=int, default=200, help="queries timed one at a time")
    p.add_argument("--kinds", default="auto,flat_int8,exact")
    a = p.parse_args()
    w = np.ascontiguousarray(np.load(os.path.join(a.dir, "w.npy")), dtype=np.float32)
    q = np.ascontiguousarray(np.load(os.path.join(a.dir, "queries.npy")), dtype=np.float32)
    k, d = w.shape
    truth = exact_top(w, q, a.top)
    print(json.dumps({"k": k, "d": d, "queries": len(q), "top": a.top,
                      "threads": os.environ.get("RAYON_NUM_THREADS", "all")}), flush=True)
    for kind in a.kinds.split(","):
        t = time.perf_counter()
        index = farout.Index(w, kind=kind)
        build = time.perf_counter() - t
        # Untimed: the calibration sample of the automatic index (its first 256 queries are
        # answered by brute force while it fits its budget), as search_peers.py's farout row.
        index.search(q[:256], a.top)

        def search(x):
            return index.search(x, a.top)[0]

        found, qps, single = timed(search, q, a.single)
        row("farout-py", f"{kind} (answering: {index.kind})", recall(found, truth), qps, single, build)
    print(json.dumps({"tool": "overhead", "us_per_call_one_row": round(overhead(d), 2)}), flush=True)


if __name__ == "__main__":
    main()
