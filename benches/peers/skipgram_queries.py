#!/usr/bin/env python3
"""The queries of the skip-gram gradient's own search: the input vectors of centre words drawn as
training draws them (each word's corpus count times its word2vec subsampling keep probability),
so that frequent words are asked about as often as training asks. Writes DIR/queries.npy beside
DIR/w.npy (the output vectors) for search_peers.py.

Installs nothing; needs numpy (the search venv of search_peers.py has it).

    farout train configs/skipgram-gcide.toml --set data.corpus=/tmp/gcide.txt
    farout export configs/skipgram-gcide.toml --set data.corpus=/tmp/gcide.txt --rows output --out DIR/w.npy
    farout export configs/skipgram-gcide.toml --set data.corpus=/tmp/gcide.txt --rows input --out DIR/input.npy
    python benches/peers/skipgram_queries.py DIR CHECKPOINT_DIR/vocab.txt [--n 1000] [--t 1e-4]
    python benches/peers/search_peers.py DIR --top 100

The vocabulary file is the checkpoint's `vocab.txt` (`word count` lines, most frequent first, the
row order of the exported matrices).
"""
import argparse
import pathlib
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=pathlib.Path, help="holds input.npy; queries.npy is written there")
    ap.add_argument("vocab", type=pathlib.Path, help="the checkpoint's vocab.txt")
    ap.add_argument("--n", type=int, default=1000, help="queries to draw (default 1000)")
    ap.add_argument("--t", type=float, default=1e-4, help="subsampling threshold (data.text.t)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    counts = []
    with open(a.vocab, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            try:
                counts.append(int(line.rsplit(" ", 1)[1]))
            except (IndexError, ValueError):
                sys.exit(f"{a.vocab}:{line_no}: expected `word count`, found {line.rstrip()!r}")
    counts = np.asarray(counts, dtype=np.float64)
    inputs = np.load(a.dir / "input.npy")
    if inputs.shape[0] != counts.size:
        sys.exit(f"{a.dir / 'input.npy'} has {inputs.shape[0]} rows, {a.vocab} {counts.size} words")
    # word2vec's rule, as farout's data.text.subsample = "word2vec": keep = sqrt(r) + r, r = t / f.
    r = a.t / (counts / counts.sum())
    weight = counts * np.minimum(np.sqrt(r) + r, 1.0)
    rng = np.random.default_rng(a.seed)
    words = rng.choice(counts.size, size=a.n, p=weight / weight.sum())
    np.save(a.dir / "queries.npy", np.ascontiguousarray(inputs[words], dtype=np.float32))
    distinct = np.unique(words).size
    print(f"{a.n} queries ({distinct} distinct words) of {counts.size} words -> {a.dir / 'queries.npy'}")


if __name__ == "__main__":
    main()
