#!/usr/bin/env python3
"""Skip-gram word vectors side by side: farout, fastText and gensim on one corpus (dict-gcide),
with the settings of configs/skipgram-gcide.toml, all evaluated by the same code
(`farout eval similarity` / `farout eval analogy --restrict 30000`). One JSON line per run.

Installs nothing. Needs:
    apt-get install dict-gcide && scripts/gcide-corpus.sh /tmp/gcide.txt
    python3 -m venv /tmp/wv-venv && /tmp/wv-venv/bin/pip install fasttext-wheel gensim numpy scipy
    /usr/bin/time (GNU time, for peak RSS), a built farout binary.
Run (from anywhere; the venv's python must be the interpreter, it imports fasttext/gensim):
    /tmp/wv-venv/bin/python benches/peers/wordvec_peers.py CORPUS OUTDIR \
        [--seeds 3] [--farout target/release/farout] [--data ../shared/data] [--subword-reference]

Settings (like for like): skip-gram (or CBOW with `--mode cbow`: farout's mode = "cbow",
fastText's model="cbow", gensim's sg=0, each with its own defaults otherwise), dim 100, window 5, 5 negatives, t = 1e-4, min_count 5,
5 epochs, 2 threads. farout: configs/skipgram-gcide.toml (lr 0.05; `--farout-lr` sets another). fastText:
train_unsupervised(model="skipgram", minn=0, maxn=0), its default lr 0.05 and other defaults
(lrUpdateRate 100, bucket 0 without subwords); its Python API (fasttext-wheel 0.9.2) has no
seed, and two threads make it non-deterministic anyway: the "seeds" are repetitions. gensim: Word2Vec(sg=1, hs=0, negative=5,
sample=1e-4, workers=2, seed) with its defaults (alpha 0.025, min_alpha 1e-4, ns_exponent 0.75).
Seeds are interleaved (seed 1: farout, fastText, gensim; seed 2: ...) so machine load affects
all alike. `--subword-reference` adds one fastText run with its default minn 3, maxn 6.
`--subwords` runs every tool with subword vectors instead: farout with
configs/skipgram-gcide-subwords.toml (minn 3, maxn 6, 2,000,000 buckets, exported as a `.model`)
and fastText with its defaults (the same n-grams and buckets); gensim is left out. WordSim-353
words outside the vocabulary then get their n-gram vectors from both (farout: the `.model`;
fastText: `get_word_vector`, appended to its `.vec` after the vocabulary, so the analogy's
30,000 candidates are unchanged), and `wordsim_oov` counts the pairs scored that way.

Fields: train_s = seconds of training as each tool measures it (farout: summary's train_seconds,
vocabulary and per-epoch evaluation excluded; fastText: the whole train_unsupervised call, which
includes reading the vocabulary, while its `words_per_s` is its own final report, words/sec/thread x 2
threads, counted from the start of its training threads); gensim: build_vocab + train, with `train_only_s` = train alone);
wall_s / cpu_s (user + system) / rss_mb = the whole process under /usr/bin/time -v (includes writing the vectors, and for
farout its per-epoch evaluation). wordsim = Spearman on WordSim-353, analogy = 3CosAdd accuracy
over the questions asked with candidates restricted to the first 30,000 words of the vector file
(each tool writes its words most frequent first; ties at the boundary are ordered differently,
so `asked` differs slightly). load1 = the 1-minute load average when the run started (the
machine may be shared: compare cpu_s as well as wall times).
"""
import argparse, json, os, re, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def train_fasttext(a):
    import fasttext
    sub = {} if a.subwords else {"minn": 0, "maxn": 0}
    t0 = time.time()
    m = fasttext.train_unsupervised(a.corpus, model=a.mode, dim=100, ws=5, neg=5, t=1e-4,
                                    minCount=5, epoch=a.epochs, thread=2, verbose=1, **sub)
    secs = time.time() - t0
    words = m.get_words(on_unicode_error="replace")
    if a.subwords and a.extra_words:
        known = set(words)
        for line in open(a.extra_words, encoding="utf-8"):
            if line.strip() and not line.startswith("#"):
                for w in line.lower().split()[:2]:
                    if w not in known:
                        known.add(w)
                        words.append(w)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(f"{len(words)} {m.get_dimension()}\n")
        for w in words:
            f.write(w + " " + " ".join(f"{x:.6f}" for x in m.get_word_vector(w)) + "\n")
    print(json.dumps({"train_s": round(secs, 2), "vocab": len(words), "args": {
        k: getattr(m, k) for k in ["lr", "dim", "ws", "epoch", "minCount", "neg", "t", "minn", "maxn",
                                   "lrUpdateRate", "bucket", "thread", "wordNgrams"]}}))


def train_gensim(a):
    from gensim.models import Word2Vec
    from gensim.models.word2vec import LineSentence
    t0 = time.time()
    m = Word2Vec(sg=int(a.mode == "skipgram"), hs=0, vector_size=100, window=5, negative=5, sample=1e-4, min_count=5,
                 workers=2, seed=a.seed)
    m.build_vocab(LineSentence(a.corpus))
    t1 = time.time()
    m.train(LineSentence(a.corpus), total_examples=m.corpus_count, epochs=a.epochs)
    t2 = time.time()
    m.wv.save_word2vec_format(a.out)
    print(json.dumps({"train_s": round(t2 - t0, 2), "train_only_s": round(t2 - t1, 2), "vocab": len(m.wv),
                      "words_per_s": round(m.corpus_total_words * a.epochs / (t2 - t1)),
                      "args": {"alpha": m.alpha, "min_alpha": m.min_alpha, "ns_exponent": m.ns_exponent}}))


def timed(cmd, env=None):
    """Runs cmd under /usr/bin/time -v; returns (stdout, stderr, wall seconds, peak RSS MB)."""
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) / 1024
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", p.stderr).group(1)
    wall = 0.0
    for part in m.split(":"):
        wall = wall * 60 + float(part)
    cpu = sum(float(re.search(rf"{k} time \(seconds\): (\S+)", p.stderr).group(1)) for k in ("User", "System"))
    return p.stdout, p.stderr, wall, rss, cpu


def evaluate(farout, vectors, data):
    sim = json.loads(subprocess.run([farout, "eval", "similarity", "--vectors", vectors, "--pairs",
                                     f"{data}/eval/wordsim353.tsv"], capture_output=True, text=True,
                                    check=True).stdout)
    ana = json.loads(subprocess.run([farout, "eval", "analogy", "--vectors", vectors, "--questions",
                                     f"{data}/eval/questions-words.txt", "--restrict", "30000"],
                                    capture_output=True, text=True, check=True).stdout)
    return sim, ana


def pick(d, *keys):
    """The first of keys found in d, searching nested objects."""
    for k in keys:
        if k in d:
            return d[k]
    for v in d.values():
        if isinstance(v, dict):
            r = pick(v, *keys)
            if r is not None:
                return r
    return None


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_train":
        p = argparse.ArgumentParser()
        p.add_argument("_", choices=["_train"])
        p.add_argument("tool", choices=["fasttext", "gensim"])
        p.add_argument("corpus")
        p.add_argument("out")
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--subwords", action="store_true")
        p.add_argument("--extra-words", help="with --subwords: also write these words' vectors (a pairs file)")
        p.add_argument("--mode", choices=["skipgram", "cbow"], default="skipgram")
        p.add_argument("--epochs", type=int, default=5)
        a = p.parse_args()
        (train_fasttext if a.tool == "fasttext" else train_gensim)(a)
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("corpus")
    p.add_argument("outdir")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--farout", default=os.path.join(ROOT, "target/release/farout"))
    p.add_argument("--data", default=os.path.join(os.path.dirname(ROOT), "shared/data"))
    p.add_argument("--tools", default="farout,fasttext,gensim")
    p.add_argument("--subword-reference", action="store_true")
    p.add_argument("--subwords", action="store_true",
                   help="every tool with subword vectors (farout and fastText; gensim is left out)")
    p.add_argument("--farout-lr", type=float, default=None,
                   help="farout's model.skip_gram.lr (default: the config's)")
    p.add_argument("--epochs", type=int, default=5, help="epochs of every tool (the config's: 5)")
    p.add_argument("--no-eval", action="store_true",
                   help="skip WordSim and analogy (a synthetic corpus shares no words with them)")
    p.add_argument("--mode", choices=["skipgram", "cbow"], default="skipgram",
                   help="cbow: farout's model.skip_gram.mode = \"cbow\", fastText's model=\"cbow\", gensim's sg=0")
    a = p.parse_args()
    corpus, out, data = os.path.abspath(a.corpus), os.path.abspath(a.outdir), os.path.abspath(a.data)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, FAROUT_DATA=data)
    tools = [t for t in a.tools.split(",") if not (a.subwords and t == "gensim")]
    runs = [(seed, tool, False) for seed in range(1, a.seeds + 1) for tool in tools]
    if a.subword_reference:
        runs.append((1, "fasttext", True))
    for seed, tool, subwords in runs:
        name = f"{tool}{'-subword' if subwords else ''}-{seed}"
        row = {"tool": tool + ("-subword" if subwords else ""), "seed": seed}
        if tool == "farout":
            vec = f"{out}/{name}.{'model' if a.subwords else 'bin'}"
            config = "configs/skipgram-gcide-subwords.toml" if a.subwords else "configs/skipgram-gcide.toml"
            cmd = [a.farout, "train", os.path.join(ROOT, config), "--overwrite",
                   "--set", f'data.corpus="{corpus}"', "--set", f'log.dir="{out}/{name}"',
                   "--set", f"seed={seed}", "--set", "log.progress=false",
                   "--summary", f"{out}/{name}.json", "--export-vectors", vec]
            if a.farout_lr is not None:
                cmd += ["--set", f"model.skip_gram.lr={a.farout_lr}"]
            if a.mode == "cbow":
                cmd += ["--set", 'model.skip_gram.mode="cbow"']
            cmd += ["--set", f"train.epochs={a.epochs}"]
            if a.no_eval:
                cmd += ["--set", "eval.heldout_pairs=0"]
            load = os.getloadavg()[0]
            _, err, wall, rss, cpu = timed(cmd, env)
            s = json.load(open(f"{out}/{name}.json"))
            row.update(train_s=round(s["train_seconds"], 2), words_per_s=round(s["words_per_second"]),
                       vocab=s["vocab"], vocab_s=round(s["vocab_seconds"], 2))
        else:
            vec = f"{out}/{name}.vec"
            cmd = [sys.executable, os.path.abspath(__file__), "_train", tool, corpus, vec, "--seed", str(seed),
                   "--mode", a.mode, "--epochs", str(a.epochs)]
            if subwords or a.subwords:
                cmd += ["--subwords", "--extra-words", f"{data}/eval/wordsim353.tsv"]
            load = os.getloadavg()[0]
            so, err, wall, rss, cpu = timed(cmd, env)
            info = json.loads(so.strip().splitlines()[-1])
            row.update({k: v for k, v in info.items() if k != "args"})
            rate = re.findall(r"words/sec/thread:\s*(\d+)", err)
            if tool == "fasttext" and rate:
                # fastText's own count: words read over the seconds since its threads started
                # (the vocabulary excluded), per thread.
                row["words_per_s"] = int(rate[-1]) * 2
            row["settings"] = info["args"]
        if not a.no_eval:
            sim, ana = evaluate(a.farout, vec, data)
            row.update(wordsim=round(pick(sim, "spearman"), 4), wordsim_pairs=pick(sim, "pairs"),
                       wordsim_oov=pick(sim, "oov"),
                       analogy=round(pick(ana, "accuracy"), 4), analogy_asked=pick(ana, "asked"))
        row.update(wall_s=round(wall, 2), cpu_s=round(cpu, 2), load1=round(load, 2), rss_mb=round(rss, 1), cmd=" ".join(cmd))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
