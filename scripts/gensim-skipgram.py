"""Side-by-side peer for `farout train configs/skipgram-gcide.toml`: gensim's skip-gram with
negative sampling on the same corpus and settings, timed and evaluated with gensim's own
analogy (restricted to the 30,000 most frequent words) and WordSim-353 code.

    python3 -m venv /tmp/peers && /tmp/peers/bin/pip install gensim==4.4.0 scipy
    /tmp/peers/bin/python scripts/gensim-skipgram.py CORPUS [--threads 2] [--seed 1] [--out V.txt]
        [--order runs/skipgram-gcide/checkpoint/vocab.txt]

--order evaluates with the words in farout's vocabulary order: the analogy test's candidates are
"the 30,000 most frequent words", and words of equal count at that boundary are ordered
differently by each tool (gensim's own order asks 6,472 questions on dict-gcide, farout's
6,552), so a fair comparison uses one order for both. Prints one JSON object. Not used by the
tests.
"""
import argparse, json, time, logging
from gensim.models import Word2Vec
from gensim.models.word2vec import LineSentence

p = argparse.ArgumentParser()
p.add_argument("corpus")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--epochs", type=int, default=5)
p.add_argument("--seed", type=int, default=1)
p.add_argument("--out")
p.add_argument("--order", help="word list (first column) giving the evaluation order")
a = p.parse_args()

t0 = time.time()
m = Word2Vec(LineSentence(a.corpus), sg=1, vector_size=100, window=5, negative=5, sample=1e-4,
             min_count=5, epochs=a.epochs, workers=a.threads, seed=a.seed)
seconds = time.time() - t0
kv = m.wv
if a.order:
    from gensim.models import KeyedVectors
    words = [line.split()[0] for line in open(a.order, encoding="utf-8")]
    assert set(words) == set(kv.index_to_key), "--order must list exactly the trained vocabulary"
    ordered = KeyedVectors(kv.vector_size)
    ordered.add_vectors(words, kv[words])
    kv = ordered
score, sections = kv.evaluate_word_analogies("../shared/data/eval/questions-words.txt", restrict_vocab=30000)
total = sections[-1]
sim = kv.evaluate_word_pairs("../shared/data/eval/wordsim353.tsv")
if a.out:
    kv.save_word2vec_format(a.out)
print(json.dumps({"peer": "gensim", "seed": a.seed, "seconds": round(seconds, 2), "vocab": len(kv),
                  "analogy": round(score, 4), "analogy_questions": len(total["correct"]) + len(total["incorrect"]),
                  "wordsim_spearman": round(sim[1].correlation, 4)}))
