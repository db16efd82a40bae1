"""farout.KeyedVectors against numpy: most_similar, similarity, lookups; the evaluations;
train_word_vectors with subwords; the errors of bad input."""

import numpy as np
import pytest

import farout


def write_text(path, words, m):
    with open(path, "w") as f:
        f.write(f"{len(words)} {m.shape[1]}\n")
        for w, row in zip(words, m):
            f.write(w + " " + " ".join(repr(float(x)) for x in row) + "\n")


@pytest.fixture
def vectors(tmp_path):
    r = np.random.default_rng(7)
    c = r.standard_normal((30, 24))
    m = (c[r.integers(0, 30, 3_000)] + 0.5 * r.standard_normal((3_000, 24))).astype(np.float32)
    words = [f"w{i}" for i in range(len(m))]
    write_text(tmp_path / "v.txt", words, m)
    return tmp_path / "v.txt", words, m


def numpy_top(m, q, topn, exclude=None):
    unit = m / np.linalg.norm(m, axis=1, keepdims=True)
    cos = unit @ (q / np.linalg.norm(q))
    if exclude is not None:
        cos[exclude] = -np.inf
    order = np.argsort(-cos, kind="stable")[:topn]
    return order, cos[order]


@pytest.mark.parametrize("fmt", ["txt", "bin", "model"])
def test_most_similar_equals_numpy_cosine_top_k(vectors, tmp_path, fmt):
    path, words, m = vectors
    kv = farout.KeyedVectors.load(path)
    if fmt != "txt":
        kv.save(tmp_path / f"v.{fmt}")
        kv = farout.KeyedVectors.load(tmp_path / f"v.{fmt}")
    assert len(kv) == 3_000 and kv.vector_size == 24 and kv.index_to_key == words
    for i in range(0, 3_000, 150):
        got = kv.most_similar(words[i], topn=10)
        order, cos = numpy_top(m, m[i], 10, exclude=i)
        assert [w for w, _ in got] == [words[j] for j in order]
        np.testing.assert_allclose([s for _, s in got], cos, atol=1e-5)
    order, cos = numpy_top(m, m[5] + m[6], 5)
    got = kv.most_similar(m[5] + m[6], topn=5)
    assert [w for w, _ in got] == [words[j] for j in order]


def test_positive_and_negative_lists_follow_gensims_formula(vectors):
    path, words, m = vectors
    kv = farout.KeyedVectors.load(path)
    unit = m / np.linalg.norm(m, axis=1, keepdims=True)
    # gensim: the mean of the weighted unit vectors (vectors given as they are), the words
    # given left out of the answer.
    query = np.mean([unit[3], unit[40], 0.5 * m[7], -unit[11], -2.0 * unit[12]], axis=0)
    order, cos = numpy_top(m, query, 8, exclude=[3, 40, 11, 12])
    got = kv.most_similar(
        positive=["w3", "w40", (m[7], 0.5)], negative=["w11", ("w12", 2.0)], topn=8
    )
    assert [w for w, _ in got] == [words[j] for j in order]
    np.testing.assert_allclose([s for _, s in got], cos, atol=1e-5)
    # One word, positional, as before; a lone negative word is the opposite direction.
    assert kv.most_similar("w3", topn=4) == kv.most_similar(positive=["w3"], topn=4)
    order, _ = numpy_top(m, -m[9], 4, exclude=[9])
    assert [w for w, _ in kv.most_similar(negative="w9", topn=4)] == [words[j] for j in order]
    with pytest.raises(farout.InvalidInput, match="at least one"):
        kv.most_similar()
    with pytest.raises(farout.InvalidInput, match="shape"):
        kv.most_similar(positive=m[:2])


def test_many_queries_go_through_the_index_and_find_the_nearest_words(vectors):
    path, words, m = vectors
    kv = farout.KeyedVectors.load(path)
    found = 0
    for i in range(600):  # past the 256 brute-force queries: the automatic index answers
        got = {w for w, _ in kv.most_similar(words[i], topn=10)}
        order, _ = numpy_top(m, m[i], 10, exclude=i)
        found += len(got & {words[j] for j in order})
    assert found / 6000 >= 0.9


def test_lookups_and_similarity(vectors):
    path, words, m = vectors
    kv = farout.KeyedVectors.load(path)
    np.testing.assert_allclose(kv["w42"], m[42], rtol=1e-6)
    assert "w42" in kv and "nowhere" not in kv and kv.get_index("w42") == 42
    with pytest.raises(KeyError, match="nowhere"):
        kv["nowhere"]
    a, b = m[1].astype(np.float64), m[2].astype(np.float64)
    assert kv.similarity("w1", "w2") == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b), abs=1e-6)


def test_evaluations_match_the_command_line_reports(vectors, tmp_path):
    path, words, m = vectors
    kv = farout.KeyedVectors.load(path)
    (tmp_path / "pairs.tsv").write_text("".join(f"w{i}\tw{i + 1}\t{i % 7}\n" for i in range(40)) + "w1\tnowhere\t3\n")
    report = kv.evaluate_word_pairs(tmp_path / "pairs.tsv")
    assert report["pairs"] == 40 and report["skipped"] == 1 and -1 <= report["spearman"] <= 1
    (tmp_path / "q.txt").write_text(": section\nw1 w2 w3 w4\nw5 w6 w7 w8\n")
    analogies = kv.evaluate_analogies(tmp_path / "q.txt", restrict=0)
    assert analogies["total"]["asked"] + analogies["total"]["skipped"] == 2 and 0 <= analogies["accuracy"] <= 1


def test_train_word_vectors_with_subwords_gives_unknown_words_a_vector(tmp_path):
    r = np.random.default_rng(1)
    vocab = ["alpha", "alphabet", "beta", "betamax", "gamma", "gammaray", "delta", "deltoid"]
    lines = [" ".join(r.choice(vocab, 12)) for _ in range(400)]
    (tmp_path / "corpus.txt").write_text("\n".join(lines) + "\n")
    kv = farout.train_word_vectors(tmp_path / "corpus.txt", epochs=2, min_count=1, dim=16, minn=3, maxn=5, buckets=5000, threads=1)
    assert len(kv) == len(vocab) and kv.vector_size == 16 and kv.has_ngrams
    oov = kv["alphabets"]  # not in the corpus: its n-grams' vector
    assert oov.shape == (16,) and np.all(np.isfinite(oov))
    got = kv.most_similar("alphabets", topn=3)
    assert len(got) == 3 and all(w in vocab for w, _ in got)


def test_bad_input_raises_the_right_exception(vectors, tmp_path):
    path, words, m = vectors
    with pytest.raises(farout.FileError):
        farout.KeyedVectors.load(tmp_path / "missing.txt")
    (tmp_path / "nan.txt").write_text("2 2\na 1 2\nb nan 3\n")
    with pytest.raises(farout.InvalidInput, match="b"):
        farout.KeyedVectors.load(tmp_path / "nan.txt")
    bad = m[:3].copy()
    bad[1, 1] = np.nan
    with pytest.raises(farout.InvalidInput, match="row 1"):
        farout.KeyedVectors(["a", "b", "c"], bad)
    kv = farout.KeyedVectors.load(path)
    with pytest.raises(farout.InvalidInput, match="topn"):
        kv.most_similar("w1", topn=0)
    with pytest.raises(farout.InvalidInput, match="values"):
        kv.most_similar(np.zeros(5, dtype=np.float32))
    with pytest.raises(KeyError):
        kv.most_similar("nowhere")
