#!/usr/bin/env python3
"""Peer extreme-classification baselines next to farout's DiSMEC.

Trains each peer on an XMC-format train file (header `N D K`, then
`l1,l2,... idx:val ...`, label list may be empty), predicts top-5 on the test
file and prints one JSON line per peer with timings and P@k / nDCG@k (percent,
samples without labels skipped, same definition as farout's dismec example).

Peers:
  omikuji    Parabel-style trees, omikuji.Model.default_hyper_param() (n_trees=3).
  pecos      XR-Linear README recipe: PIFA label embedding -> Indexer.gen
             (hierarchicalkmeans, defaults) -> XLinearModel.train (defaults),
             predict with the default beam (10), only_topk=5, from the saved model reloaded with
             is_predict_only=True (about 10x faster than the model train() returns; the reload
             is predict_model_load_seconds, not in the prediction time).
  fasttext-hs, fasttext-softmax
             fastText supervised (pip fasttext-wheel, train_supervised), -loss hs or
             -loss softmax, dim 100, 25 epochs, --threads threads, lr 0.5 (--ft-lr), the
             other supervised defaults (minCount 1, wordNgrams 1, no subwords, hence bucket 0,
             which fastText sets itself then); predict k = 5. lr 0.5 because the data README's
             fastText 0.9.3 figures come back at lr 0.5 within 0.7 point and not at the
             default 0.1 (Bibtex ova P@1/3/5 57.3 / 34.5 / 25.6 against 46.6 / 27.0 / 20.4).
             Each document becomes a text line `__label__L1 __label__L2 ... fJ fJ ...`,
             feature J written c_J times, c_J its count (see --ft-tokens); train_seconds covers
             train_supervised only (it reads the text file), the conversion to text is
             convert_seconds. Raw features only (not with --tfidf).
  liblinear  one-vs-all LIBLINEAR `-s 2 -B 1 -c 1 -e 0.01 -q` (L2-reg. squared
             hinge, primal), one binary problem per label, labels spread over
             --threads worker processes; predict = top-5 of all K decision values.

--tfidf: x_ij <- x_ij * idf_j with idf_j = ln((1+N)/(1+df_j)) + 1 (scikit-learn's
smoothed idf, the same formula as farout-data's `idf()`), fitted on train and
applied to train and test, then every row scaled to unit L2 norm.

train_cpu_seconds (omikuji, pecos, fasttext) is this process's CPU time (all threads) during training;
for liblinear train_cpu_seconds_summed is the sum of per-label CPU times in the workers.

--ft-tokens (fastText): how a row's values become token counts.
  auto       integral values (bibtex, delicious: all 1) are the counts; otherwise the values are
             taken as farout's generator writes them (`farout data gen xmc`: 1 + ln(count), then
             the row scaled to unit L2 norm) and inverted: c = round(exp(v / v_min - 1)), v_min
             the row's smallest value, taken as a count of 1. If that leaves any value more than
             0.01 from an integer count the row falls back to each feature once. The JSON
             reports the choice (ft_tokens) and the rows that fell back.
  binary     each feature once.

Run each peer in its own process (--only X) when peak RSS matters: peak_rss_bytes
is the high-water mark of this whole process (ru_maxrss), children reported apart.

Example:
  python xmc_peers.py --train .../bibtex/train.txt --test .../bibtex/test.txt \
      --threads 2 --only omikuji --tfidf
"""
import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time

import numpy as np
import scipy.sparse as sp


# ----------------------------------------------------------------------------- data
def read_xmc(path):
    """Returns (X csr float32 N x D, Y csr float32 N x K, header (N, D, K))."""
    with open(path) as f:
        n, d, k = (int(t) for t in f.readline().split())
        indptr, indices, values = [0], [], []
        yptr, ycols = [0], []
        for line in f:
            toks = line.split()
            if not toks and not line.strip():
                # blank line: a sample with no labels and no features
                pass
            start = 0
            if toks and ":" not in toks[0]:
                ycols.extend(int(l) for l in toks[0].split(",") if l != "")
                start = 1
            for t in toks[start:]:
                i, v = t.split(":")
                indices.append(int(i))
                values.append(float(v))
            indptr.append(len(indices))
            yptr.append(len(ycols))
    rows = len(indptr) - 1
    if rows != n:
        print(f"warning: {path}: header says {n} rows, read {rows}", file=sys.stderr)
    X = sp.csr_matrix((np.asarray(values, np.float32), np.asarray(indices, np.int32), np.asarray(indptr, np.int64)),
                      shape=(rows, d))
    X.sum_duplicates()
    X.sort_indices()
    Y = sp.csr_matrix((np.ones(len(ycols), np.float32), np.asarray(ycols, np.int32), np.asarray(yptr, np.int64)),
                      shape=(rows, k))
    Y.sum_duplicates()
    Y.data[:] = 1.0
    return X, Y, (n, d, k)


def tfidf_fit(X):
    df = np.bincount(X.indices, minlength=X.shape[1]).astype(np.float64)
    n = X.shape[0]
    return (np.log((1.0 + n) / (1.0 + df)) + 1.0).astype(np.float32)


def tfidf_apply(X, idf):
    X = X.copy()
    X.data *= idf[X.indices]
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    norms[norms == 0] = 1.0
    X = sp.csr_matrix(sp.diags(1.0 / norms) @ X, dtype=np.float32)
    X.sort_indices()
    return X


def write_xmc(path, X, Y):
    with open(path, "w") as f:
        f.write(f"{X.shape[0]} {X.shape[1]} {Y.shape[1]}\n")
        for i in range(X.shape[0]):
            labels = ",".join(map(str, Y.indices[Y.indptr[i]:Y.indptr[i + 1]]))
            s, e = X.indptr[i], X.indptr[i + 1]
            feats = " ".join(f"{j}:{v:.7g}" for j, v in zip(X.indices[s:e], X.data[s:e]))
            f.write(f"{labels} {feats}\n")


# ----------------------------------------------------------------------------- metrics
def ranking_metrics(topk, Y):
    """topk: list/array of predicted label ids per test row (best first, up to 5)."""
    ks = (1, 3, 5)
    p = np.zeros(3)
    nd = np.zeros(3)
    n = 0
    for i in range(Y.shape[0]):
        pos = set(Y.indices[Y.indptr[i]:Y.indptr[i + 1]].tolist())
        if not pos:
            continue
        n += 1
        hit, dcg = 0, 0.0
        pred = list(topk[i])[:5]
        for r in range(5):
            if r < len(pred) and pred[r] in pos:
                hit += 1
                dcg += 1.0 / np.log2(r + 2)
            if r + 1 in ks:
                a = ks.index(r + 1)
                idcg = sum(1.0 / np.log2(j + 2) for j in range(min(r + 1, len(pos))))
                p[a] += hit / (r + 1)
                nd[a] += dcg / idcg
    p, nd = 100 * p / max(n, 1), 100 * nd / max(n, 1)
    out = {f"p@{k}": round(float(v), 2) for k, v in zip(ks, p)}
    out.update({f"ndcg@{k}": round(float(v), 2) for k, v in zip(ks, nd)})
    out["n_eval"] = n
    return out


def topk_from_csr(P, k=5):
    res = []
    for i in range(P.shape[0]):
        s, e = P.indptr[i], P.indptr[i + 1]
        idx, val = P.indices[s:e], P.data[s:e]
        order = np.argsort(-val, kind="stable")[:k]
        res.append(idx[order].tolist())
    return res


def dir_bytes(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


# ----------------------------------------------------------------------------- peers
def run_omikuji(args, data, tmp):
    import omikuji
    from importlib.metadata import version
    Xtr, Ytr, Xte, Yte = data
    if args.tfidf:
        path = os.path.join(tmp, "omikuji_train.txt")
        write_xmc(path, Xtr, Ytr)
    else:
        path = args.train
    hp = omikuji.Model.default_hyper_param()
    hp.n_trees = 3
    t0, c0 = time.perf_counter(), time.process_time()
    model = omikuji.Model.train_on_data(path, hp, n_threads=args.threads)
    train_s, train_cpu = time.perf_counter() - t0, time.process_time() - c0
    mpath = os.path.join(tmp, "omikuji_model")
    model.save(mpath)
    preds = []
    t0 = time.perf_counter()
    for i in range(Xte.shape[0]):
        s, e = Xte.indptr[i], Xte.indptr[i + 1]
        pairs = list(zip(Xte.indices[s:e].tolist(), Xte.data[s:e].tolist()))
        preds.append([l for l, _ in model.predict(pairs, beam_size=10, top_k=5)])
    pred_s = time.perf_counter() - t0
    hpd = {f: getattr(hp, f) for f in dir(hp)}
    return dict(version=version("omikuji"), train_seconds=train_s, train_cpu_seconds=round(train_cpu, 3), predict_s=pred_s, topk=preds,
                model_bytes=dir_bytes(mpath), params=hpd, predict_note="python per-sample predict(beam_size=10, top_k=5), 1 thread")


def run_pecos(args, data, tmp):
    from importlib.metadata import version
    from pecos.xmc import Indexer, LabelEmbeddingFactory
    from pecos.xmc.xlinear.model import XLinearModel
    Xtr, Ytr, Xte, Yte = data
    t0, c0 = time.perf_counter(), time.process_time()
    label_feat = LabelEmbeddingFactory.create(Ytr, Xtr, method="pifa", threads=args.threads)
    cluster_chain = Indexer.gen(label_feat, indexer_type="hierarchicalkmeans", threads=args.threads)
    t_index = time.perf_counter() - t0
    xlm = XLinearModel.train(Xtr, Ytr, C=cluster_chain, threads=args.threads)
    train_s, train_cpu = time.perf_counter() - t0, time.process_time() - c0
    mpath = os.path.join(tmp, "pecos_model")
    xlm.save(mpath)
    depth = len(xlm.model.model_chain)
    # PECOS predicts about 10x faster from a model loaded for prediction only (its weights
    # re-laid out by chunks) than from the model train() returns: time that, as its users do.
    t0 = time.perf_counter()
    xlm = XLinearModel.load(mpath, is_predict_only=True)
    load_model_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    P = xlm.predict(Xte, only_topk=5, threads=args.threads)
    pred_s = time.perf_counter() - t0
    return dict(version=version("libpecos"), train_seconds=train_s, train_cpu_seconds=round(train_cpu, 3), indexer_seconds=t_index, predict_s=pred_s,
                predict_model_load_seconds=round(load_model_s, 3),
                topk=topk_from_csr(P.tocsr()), model_bytes=dir_bytes(mpath),
                params=dict(label_emb="pifa", indexer="hierarchicalkmeans defaults (nr_splits=16, max_leaf_size=100)",
                            train="XLinearModel.train defaults", predict="beam_size default(10), only_topk=5",
                            depth=depth))


def _ft_counts(X, mode):
    """Per-nonzero token counts (int array aligned with X.data) and a description of the choice."""
    v = X.data.astype(np.float64)
    if mode == "binary":
        return np.ones(len(v), np.int64), "binary (each feature once)", 0
    if len(v) == 0 or np.all(np.abs(v - np.round(v)) < 1e-6):
        return np.maximum(np.round(v), 0).astype(np.int64), "counts (integral values)", 0
    counts = np.ones(len(v), np.int64)
    fallback = 0
    for i in range(X.shape[0]):
        s, e = X.indptr[i], X.indptr[i + 1]
        if s == e:
            continue
        r = v[s:e]
        vmin = r.min()
        if vmin <= 0:
            fallback += 1
            continue
        c = np.exp(r / vmin - 1.0)
        if np.abs(c - np.round(c)).max() > 0.01:
            fallback += 1
            continue
        counts[s:e] = np.round(c).astype(np.int64)
    return counts, "inverted (1 + ln count) / L2 norm: c = round(exp(v / v_min - 1))", fallback


def _ft_lines(X, Y, mode):
    counts, how, fallback = _ft_counts(X, mode)
    lines = []
    for i in range(X.shape[0]):
        s, e = X.indptr[i], X.indptr[i + 1]
        toks = [] if Y is None else [f"__label__{l}" for l in Y.indices[Y.indptr[i]:Y.indptr[i + 1]]]
        for j, c in zip(X.indices[s:e].tolist(), counts[s:e].tolist()):
            toks.extend([f"f{j}"] * c)
        lines.append(" ".join(toks))
    return lines, how, fallback, int(counts.sum())


def run_fasttext(args, data, tmp, loss):
    import fasttext
    from importlib.metadata import version
    if args.tfidf:
        raise SystemExit("fasttext peers read token counts; run them without --tfidf")
    Xtr, Ytr, Xte, Yte = data
    t0 = time.perf_counter()
    tr_lines, how, fb_tr, ntok = _ft_lines(Xtr, Ytr, args.ft_tokens)
    te_lines, _, fb_te, _ = _ft_lines(Xte, None, args.ft_tokens)
    path = os.path.join(tmp, "fasttext_train.txt")
    with open(path, "w") as f:
        for l in tr_lines:
            f.write(l + "\n")
    convert_s = time.perf_counter() - t0
    params = dict(loss=loss, dim=100, epoch=25, lr=args.ft_lr, minCount=1, wordNgrams=1, minn=0, maxn=0,
                  bucket=0, thread=args.threads, verbose=0)
    t0, c0 = time.perf_counter(), time.process_time()
    model = fasttext.train_supervised(input=path, **params)
    train_s, train_cpu = time.perf_counter() - t0, time.process_time() - c0
    mpath = os.path.join(tmp, "fasttext_model.bin")
    model.save_model(mpath)
    t0 = time.perf_counter()
    labels, _ = model.predict(te_lines, k=5)
    pred_s = time.perf_counter() - t0
    preds = [[int(l[len("__label__"):]) for l in ls] for ls in labels]
    return dict(version=version("fasttext-wheel"), train_seconds=train_s, train_cpu_seconds=round(train_cpu, 3),
                convert_seconds=round(convert_s, 3), predict_s=pred_s, topk=preds, model_bytes=dir_bytes(mpath),
                ft_tokens=how, ft_rows_fallback_binary=fb_tr + fb_te, ft_train_tokens=ntok,
                ft_train_words=len(model.words), ft_labels_seen=len(model.labels), params=params,
                predict_note="model.predict(list of test lines, k=5), 1 thread")


# liblinear worker state (set in each forked worker)
_LL = {}


def _ll_init(X, Ycsc, Xte, param_str):
    from liblinear.liblinearutil import problem, parameter
    y0 = np.full(X.shape[0], -1.0)
    _LL["prob"] = problem(y0, X)
    _LL["param"] = parameter(param_str)
    _LL["Y"] = Ycsc
    _LL["Xte"] = Xte
    _LL["n"] = X.shape[0]
    _LL["y"] = np.ctypeslib.as_array(_LL["prob"].y, (X.shape[0],))


def _ll_train(label):
    """Trains one label; returns its test decision values (not its weights: 17,000 nearly dense
    weight vectors over 75,000 features would not fit in memory)."""
    from liblinear.liblinearutil import train
    prob, Y, n = _LL["prob"], _LL["Y"], _LL["n"]
    pos = Y.indices[Y.indptr[label]:Y.indptr[label + 1]]
    if len(pos) == 0 or len(pos) == n:
        return label, None, 0, 0.0, 0.0, len(pos)
    y = _LL["y"]
    y[:] = -1.0
    y[pos] = 1.0
    c0, w0 = time.process_time(), time.perf_counter()
    m = train(prob, _LL["param"])
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    nf = m.nr_feature
    w = np.ctypeslib.as_array(m.w, shape=(nf + 1,)).copy()
    if m.get_labels()[0] != 1:  # liblinear's w scores its first-seen class
        w = -w
    Xte = _LL["Xte"]
    scores = (Xte[:, :nf] @ w[:nf] + w[nf]).astype(np.float32)
    return label, scores, int(np.count_nonzero(w[:nf])), cpu, wall, len(pos)


def run_liblinear(args, data, tmp):
    import multiprocessing as mp
    from importlib.metadata import version
    Xtr, Ytr, Xte, Yte = data
    K, D = Ytr.shape[1], Xtr.shape[1]
    labels = np.arange(K)
    extrapolated = False
    if args.ll_sample and args.ll_sample < K:
        rng = np.random.default_rng(args.seed)
        labels = np.sort(rng.choice(K, args.ll_sample, replace=False))
        extrapolated = True
    param_str = f"-s 2 -c {args.ll_c} -e {args.ll_eps} -B 1 -q"
    Ycsc = Ytr.tocsc()
    Ycsc.sort_indices()
    # liblinear's problem() takes scipy CSR (column j -> feature j+1), builds it once per worker
    Xll = sp.csr_matrix(Xtr, dtype=np.float64)
    Xte64 = sp.csr_matrix(Xte, dtype=np.float64)
    if Xte64.shape[1] < D:
        Xte64.resize((Xte64.shape[0], D))
    # test decision values, one column per label; labels never trained (no positives, or not in
    # the sample) never rank
    S = np.full((Xte.shape[0], K), -np.inf, np.float32)
    t0 = time.perf_counter()
    ctx = mp.get_context("fork")
    cpu_sum, wall_sum, done, n_trivial, nnz = 0.0, 0.0, 0, 0, 0
    per_label_wall = []
    with ctx.Pool(args.threads, initializer=_ll_init, initargs=(Xll, Ycsc, Xte64, param_str)) as pool:
        for label, scores, nz, cpu, wall, npos in pool.imap_unordered(_ll_train, labels.tolist(), chunksize=4):
            done += 1
            if scores is None:
                n_trivial += 1
                continue
            cpu_sum += cpu
            wall_sum += wall
            per_label_wall.append(wall)
            nnz += nz
            S[:, label] = scores
            if args.verbose and done % 500 == 0:
                el = time.perf_counter() - t0
                print(f"liblinear: {done}/{len(labels)} labels, {el:.1f}s", file=sys.stderr, flush=True)
    # train_seconds includes scoring the test set in the workers (per_label_seconds does not)
    train_s = time.perf_counter() - t0
    out = dict(version=version("liblinear-official"), train_seconds=train_s,
               train_cpu_seconds_summed=round(cpu_sum, 3), label_wall_seconds_summed=round(wall_sum, 3),
               labels_trained=len(labels), labels_without_positives=n_trivial,
               per_label_seconds_mean=round(wall_sum / max(len(per_label_wall), 1), 6),
               model_nnz=nnz, model_bytes_sparse=nnz * 8 + (K + 1) * 8,
               params=param_str + f" (one-vs-all, {args.threads} processes)")
    if extrapolated:
        out["extrapolated_total_train_seconds"] = round(train_s * K / len(labels), 1)
        out["extrapolated_total_cpu_seconds"] = round(cpu_sum * K / len(labels), 1)
        out["note"] = f"trained a random sample of {len(labels)}/{K} labels (seed {args.seed}); totals extrapolated linearly; no P@k"
        out["topk"] = None
        out["predict_s"] = None
        return out
    t0 = time.perf_counter()
    kk = min(5, K)
    part = np.argpartition(-S, kk - 1, axis=1)[:, :kk]
    sc = np.take_along_axis(S, part, axis=1)
    order = np.argsort(-sc, axis=1, kind="stable")
    out["predict_s"] = time.perf_counter() - t0
    out["topk"] = np.take_along_axis(part, order, axis=1).tolist()
    return out


PEERS = {"omikuji": run_omikuji, "pecos": run_pecos, "liblinear": run_liblinear,
         "fasttext-hs": lambda a, d, t: run_fasttext(a, d, t, "hs"),
         "fasttext-softmax": lambda a, d, t: run_fasttext(a, d, t, "softmax")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="omikuji,pecos,liblinear", help="comma list of " + ",".join(PEERS))
    ap.add_argument("--tfidf", action="store_true", help="tf-idf (smoothed idf) + L2 row normalisation")
    ap.add_argument("--ll-sample", type=int, default=0, help="liblinear: train only a random sample of labels")
    ap.add_argument("--ll-c", type=float, default=1.0)
    ap.add_argument("--ll-eps", type=float, default=0.01)
    ap.add_argument("--ft-tokens", choices=("auto", "binary"), default="auto",
                    help="fastText: values -> token counts (see above)")
    ap.add_argument("--ft-lr", type=float, default=0.5, help="fastText learning rate")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tmp", default="/tmp/peers/tmp")
    ap.add_argument("--tag", default="", help="free text copied into the JSON")
    ap.add_argument("--max-test", type=int, default=0, help="evaluate on the first M test rows only (0 = all)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.tmp, exist_ok=True)

    t0 = time.perf_counter()
    Xtr, Ytr, _ = read_xmc(args.train)
    Xte, Yte, _ = read_xmc(args.test)
    if args.max_test and args.max_test < Xte.shape[0]:
        Xte, Yte = Xte[:args.max_test], Yte[:args.max_test]
    K = max(Ytr.shape[1], Yte.shape[1])
    D = max(Xtr.shape[1], Xte.shape[1])
    Xtr.resize((Xtr.shape[0], D)); Xte.resize((Xte.shape[0], D))
    Ytr.resize((Ytr.shape[0], K)); Yte.resize((Yte.shape[0], K))
    if args.tfidf:
        idf = tfidf_fit(Xtr)
        Xtr, Xte = tfidf_apply(Xtr, idf), tfidf_apply(Xte, idf)
    load_s = time.perf_counter() - t0
    data = (Xtr, Ytr, Xte, Yte)

    for name in [p.strip() for p in args.only.split(",") if p.strip()]:
        tmp = tempfile.mkdtemp(prefix=f"{name}_", dir=args.tmp)
        try:
            r = PEERS[name](args, data, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        topk = r.pop("topk")
        pred_s = r.pop("predict_s")
        out = {"peer": name, "version": r.pop("version"),
               "data": os.path.dirname(os.path.abspath(args.train)),
               "features": "tfidf+l2" if args.tfidf else "raw", "threads": args.threads,
               "n_train": Xtr.shape[0], "n_test": Xte.shape[0], "n_features": D, "n_labels": K,
               "load_s": round(load_s, 3), "train_seconds": round(r.pop("train_seconds"), 3),
               "predict_ms_per_sample": None if pred_s is None else round(1e3 * pred_s / max(Xte.shape[0], 1), 4)}
        if topk is not None:
            out.update(ranking_metrics(topk, Yte))
        out.update(r)
        out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        ch = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        if ch:
            out["peak_rss_children_max_bytes"] = ch
        out["loadavg"] = os.getloadavg()[0]
        if args.tag:
            out["tag"] = args.tag
        print(json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    main()
