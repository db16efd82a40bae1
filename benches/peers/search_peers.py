#!/usr/bin/env python3
"""Maximum inner product search side by side: FAISS, hnswlib and ScaNN on the vectors farout
searched, each swept over its main knob, with recall@Q against exact search and queries per
second, batched (256 queries per call, as in training) and one query at a time. One JSON line
per configuration.

Installs nothing. Needs a venv with the peers:
    python3 -m venv /tmp/search-venv && /tmp/search-venv/bin/pip install faiss-cpu hnswlib scann numpy
and vectors written by farout:
    farout bench search --k 200000 --d 128 --top 100 --queries 1000 --export DIR
Run:
    /tmp/search-venv/bin/python benches/peers/search_peers.py DIR --top 100 [--threads 2]
        [--tools numpy,faiss-flat,faiss-sq8,faiss-ivf,faiss-ivfpq-fastscan,faiss-hnsw,hnswlib,scann,farout]
        [--farout target/release/farout] [--defaults-only] [--plot recall-qps.png]

`farout` runs `farout bench search --vectors DIR/w.npy --query-vectors DIR/queries.npy` last, in
the same run: with its defaults (the spherical index calibrating its budget to recall 0.9 on the
first batch of the queries), brute force (`exact`) and brute force on int8 codes (`flat_int8`),
then the spherical index with int8 scoring at fixed candidate factors that scan 1,000 to 32,000
candidates.
`--plot` draws recall against batched queries per second for every tool (needs matplotlib).

Fields: tool, params, recall (mean over the queries of |found ∩ exact top-Q| / Q), qps (batches
of 256), qps_single (the first `--single` queries one by one), build_s. farout's defaults also
give the recall of the queries searched one by one (its index may score them otherwise). Exact top-Q comes from
numpy's BLAS product (`numpy` row: its own qps). Every library runs with `--threads` threads.
"""
import argparse, json, os, subprocess, sys, time

import numpy as np

BATCH = 256


def exact_top(w, q, top):
    s = q @ w.T
    idx = np.argpartition(-s, top - 1, axis=1)[:, :top]
    return idx


def recall(found, truth):
    hits = 0
    for f, t in zip(found, truth):
        hits += len(set(int(x) for x in f if x >= 0) & set(int(x) for x in t))
    return hits / truth.size


def timed(search, q, single):
    """qps of `search` over q in batches of 256, and over the first `single` queries alone."""
    t = time.perf_counter()
    found = np.concatenate([search(q[i:i + BATCH]) for i in range(0, len(q), BATCH)])
    qps = len(q) / (time.perf_counter() - t)
    n = min(single, len(q))
    t = time.perf_counter()
    for i in range(n):
        search(q[i:i + 1])
    return found, qps, n / (time.perf_counter() - t)


ROWS = []


def row(tool, params, rec, qps, qps_single, build_s):
    r = {"tool": tool, "params": params, "recall": round(rec, 4), "qps": round(qps, 1),
         "qps_single": round(qps_single, 1), "build_s": round(build_s, 2)}
    ROWS.append(r)
    print(json.dumps(r), flush=True)


def emit(tool, params, found, qps, qps_single, build_s, truth):
    row(tool, params, recall(found, truth), qps, qps_single, build_s)


def plot(path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for tool in dict.fromkeys(r["tool"] for r in ROWS):
        pts = sorted((r["recall"], r["qps"]) for r in ROWS if r["tool"] == tool)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=tool, markersize=3)
    ax.set_xlabel("recall@Q")
    ax.set_ylabel("queries/s (batches of 256)")
    ax.set_yscale("log")
    ax.axvline(0.9, color="grey", linewidth=0.5)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir")
    p.add_argument("--top", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--single", type=int, default=1000, help="queries timed one at a time")
    p.add_argument("--defaults-only", action="store_true",
                   help="farout with its defaults only, not brute force and fixed candidate factors")
    p.add_argument("--tools", default="numpy,faiss-flat,faiss-sq8,faiss-ivf,faiss-ivfpq-fastscan,faiss-hnsw,hnswlib,scann,farout")
    p.add_argument("--farout", default=os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "target/release/farout"))
    p.add_argument("--plot", help="write recall against queries/s here (PNG)")
    a = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    w = np.ascontiguousarray(np.load(os.path.join(a.dir, "w.npy")), dtype=np.float32)
    q = np.ascontiguousarray(np.load(os.path.join(a.dir, "queries.npy")), dtype=np.float32)
    k, d = w.shape
    top = a.top
    tools = a.tools.split(",")
    truth = exact_top(w, q, top)
    print(json.dumps({"k": k, "d": d, "queries": len(q), "top": top, "threads": a.threads}), flush=True)

    if "numpy" in tools:
        found, qps, single = timed(lambda x: exact_top(w, x, top), q, a.single)
        emit("numpy", "q @ w.T + argpartition", found, qps, single, 0.0, truth)

    if any(t.startswith("faiss") for t in tools):
        import faiss
        faiss.omp_set_num_threads(a.threads)
        ip = faiss.METRIC_INNER_PRODUCT

        def faiss_search(index):
            return lambda x: index.search(x, top)[1]

        if "faiss-flat" in tools:
            t = time.perf_counter()
            index = faiss.IndexFlatIP(d)
            index.add(w)
            build = time.perf_counter() - t
            found, qps, single = timed(faiss_search(index), q, a.single)
            emit("faiss-flat", "IndexFlatIP", found, qps, single, build, truth)
        if "faiss-sq8" in tools:
            # Every row scanned on 8-bit scalar-quantised codes, the best k_factor x Q re-ranked
            # exactly: FAISS's counterpart of farout's flat_int8.
            for k_factor in [1, 4, 16]:
                t = time.perf_counter()
                quantised = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_8bit, ip)
                quantised.train(w)
                index = faiss.IndexRefineFlat(quantised)
                index.k_factor = k_factor
                index.add(w)
                build = time.perf_counter() - t
                found, qps, single = timed(faiss_search(index), q, a.single)
                emit("faiss-sq8", f"SQ8 + RefineFlat k_factor={k_factor}", found, qps, single, build, truth)
        nlist = int(4 * np.sqrt(k))
        if "faiss-ivf" in tools:
            t = time.perf_counter()
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, ip)
            index.train(w)
            index.add(w)
            build = time.perf_counter() - t
            for nprobe in [1, 2, 4, 8, 16, 32, 64, 128]:
                index.nprobe = nprobe
                found, qps, single = timed(faiss_search(index), q, a.single)
                emit("faiss-ivf", f"IVF{nlist},Flat nprobe={nprobe}", found, qps, single, build, truth)
        if "faiss-ivfpq-fastscan" in tools:
            # Two dimensions per sub-quantizer: an odd D gets a zero column (inner products
            # unchanged), as FAISS's PQ needs D divisible by the sub-quantizers.
            dp = d + d % 2
            pad = (lambda x: np.ascontiguousarray(np.pad(x, ((0, 0), (0, 1))))) if dp > d else (lambda x: x)
            t = time.perf_counter()
            base = faiss.IndexIVFPQFastScan(faiss.IndexFlatIP(dp), dp, nlist, dp // 2, 4, ip)
            index = faiss.IndexRefineFlat(base)
            index.train(pad(w))
            index.add(pad(w))
            build = time.perf_counter() - t
            for nprobe in [4, 8, 16, 32, 64]:
                for k_factor in [1, 2, 4, 8]:
                    base.nprobe = nprobe
                    index.k_factor = k_factor
                    found, qps, single = timed(lambda x: index.search(pad(x), top)[1], q, a.single)
                    emit("faiss-ivfpq-fastscan", f"IVF{nlist},PQ{dp // 2}x4fs,RFlat nprobe={nprobe} k_factor={k_factor}",
                         found, qps, single, build, truth)
        if "faiss-hnsw" in tools:
            t = time.perf_counter()
            index = faiss.IndexHNSWFlat(d, 32, ip)
            index.hnsw.efConstruction = 200
            index.add(w)
            build = time.perf_counter() - t
            for ef in [top, 2 * top, 4 * top, 8 * top]:
                index.hnsw.efSearch = ef
                found, qps, single = timed(faiss_search(index), q, a.single)
                emit("faiss-hnsw", f"HNSW32 efConstruction=200 efSearch={ef}", found, qps, single, build, truth)

    if "hnswlib" in tools:
        import hnswlib
        t = time.perf_counter()
        index = hnswlib.Index(space="ip", dim=d)
        index.init_index(max_elements=k, ef_construction=200, M=16)
        index.set_num_threads(a.threads)
        index.add_items(w, np.arange(k))
        build = time.perf_counter() - t
        for ef in [top, 2 * top, 4 * top, 8 * top]:
            index.set_ef(ef)
            found, qps, single = timed(lambda x: index.knn_query(x, k=top)[0], q, a.single)
            emit("hnswlib", f"M=16 ef_construction=200 ef={ef}", found, qps, single, build, truth)

    if "scann" in tools:
        import scann
        leaves = int(np.sqrt(k))
        t = time.perf_counter()
        searcher = (scann.scann_ops_pybind.builder(w, top, "dot_product")
                    .tree(num_leaves=leaves, num_leaves_to_search=leaves // 20, training_sample_size=min(k, 250_000))
                    .score_ah(2, anisotropic_quantization_threshold=0.2)
                    .reorder(4 * top).build())
        searcher.set_num_threads(a.threads)
        build = time.perf_counter() - t
        # Leaves searched in steps of about 1.5x and three re-ranking depths: coarser steps
        # would leave ScaNN's best setting at recall 0.9 between two measured ones. For a few
        # results also 100 re-ranked: at K = 1,000,000, top 10, 4 x Q stays below recall 0.9.
        for search_leaves in sorted({leaves // d for d in [100, 50, 30, 20, 15, 10, 7, 5]}):
            for reorder in sorted({2 * top, 3 * top, 4 * top, max(4 * top, 100)}):
                def search(x, n=max(search_leaves, 1), r=reorder):
                    if len(x) == 1:
                        return searcher.search(x[0], final_num_neighbors=top, leaves_to_search=n,
                                               pre_reorder_num_neighbors=r)[0][None, :]
                    return searcher.search_batched_parallel(x, final_num_neighbors=top, leaves_to_search=n,
                                                            pre_reorder_num_neighbors=r)[0]
                found, qps, single = timed(search, q, a.single)
                emit("scann", f"leaves={leaves} search={max(search_leaves, 1)} AH2 reorder={reorder}",
                     found, qps, single, build, truth)

    if "farout" in tools:
        env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
        base = [a.farout, "bench", "search", "--vectors", os.path.join(a.dir, "w.npy"), "--query-vectors",
                os.path.join(a.dir, "queries.npy"), "--top", str(top)]
        # The defaults: the spherical index calibrating its budget to recall 0.9 (on the first
        # batch of the queries).
        r = json.loads(subprocess.run(base, capture_output=True, text=True, check=True, env=env).stdout)
        fits = ", ".join(f"{c['probed']:.0f} rows scanned" if c["budget"] else "brute force"
                         for c in r.get("calibrations", []))
        single = f"; one at a time recall {r['recall_single']:.4f}" if "recall_single" in r else ""
        row("farout", f"spherical defaults ({r['index']}; {fits or 'not calibrated'}{single})", r["recall"], r["qps"],
            r["qps_single"], r["build_seconds"])
        if not a.defaults_only:
            # Brute force in f32, and on int8 codes with exact rescoring.
            for kind in ["exact", "flat_int8"]:
                r = json.loads(subprocess.run(base + ["--index", kind], capture_output=True, text=True, check=True,
                                              env=env).stdout)
                row("farout", kind, r["recall"], r["qps"], r["qps_single"], r["build_seconds"])
            # Candidate factors that scan 1,000 to 32,000 candidates whatever Q is.
            for factor in sorted({max(1, c // top) for c in [1000, 2000, 4000, 8000, 16000, 32000]}):
                cmd = base + ["--scoring", "int8", "--candidate-factor", str(factor)]
                r = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout)
                row("farout", f"spherical int8 candidate_factor={factor}", r["recall"], r["qps"], r["qps_single"],
                    r["build_seconds"])

    if a.plot:
        plot(a.plot, f"K = {k}, D = {d}, top {top}, {a.threads} threads")


if __name__ == "__main__":
    sys.exit(main())
