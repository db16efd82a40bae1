"""farout.Index against numpy brute force: recall, exact scores, update, save and load, and
the errors of bad input."""

import numpy as np
import pytest

import farout

SAVEABLE = [
    ("auto", {}),
    ("spherical", {"exact_below": 0}),
    ("flat_int8", {}),
    ("simple_lsh", {}),
    ("hamming", {}),
    ("exact", {}),
]


def clustered(n=12_000, d=32, centres=150, seed=0):
    """Rows around `centres` random directions, and 400 queries drawn the same way."""
    r = np.random.default_rng(seed)
    c = r.standard_normal((centres, d)).astype(np.float32)
    w = c[r.integers(0, centres, n)] + 0.4 * r.standard_normal((n, d)).astype(np.float32)
    q = c[r.integers(0, centres, 400)] + 0.4 * r.standard_normal((400, d)).astype(np.float32)
    return w.astype(np.float32), q.astype(np.float32)


def brute_force(w, q, k):
    scores = q @ w.T
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def overlap(found, exact):
    return np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, exact)])


def test_recall_against_numpy_brute_force_is_at_least_0_9_with_exact_scores():
    w, q = clustered()
    index = farout.Index(w, kind="auto", recall=0.9)
    assert len(index) == w.shape[0] and index.dim == w.shape[1]
    index.search(q[:300], k=10)  # the calibration sample (answered by brute force)
    ids, scores = index.search(q, k=10)
    assert ids.dtype == np.int64 and scores.dtype == np.float32 and ids.shape == (400, 10)
    assert overlap(ids, brute_force(w, q, 10)) >= 0.9
    np.testing.assert_allclose(scores, np.einsum("nd,nkd->nk", q, w[ids]), rtol=1e-4, atol=1e-4)
    assert np.all(np.diff(scores, axis=1) <= 0), "best first"
    assert index.recall(q, 10) >= 0.9


def test_one_query_at_a_time_equals_the_batch():
    w, q = clustered(n=3_000)
    index = farout.Index(w, kind="flat_int8")
    ids, scores = index.search(q[:50], k=5)
    for i in range(50):
        one_ids, one_scores = index.search(q[i], k=5)
        np.testing.assert_array_equal(one_ids[0], ids[i])
        np.testing.assert_allclose(one_scores[0], scores[i], rtol=1e-5)


@pytest.mark.parametrize("kind,params", [("exact", {}), ("flat_int8", {}), ("spherical", {"candidate_factor": 10.0})])
def test_update_then_search_equals_a_rebuilt_index(kind, params):
    w, q = clustered(n=6_000)
    index = farout.Index(w, kind=kind, **params)
    r = np.random.default_rng(3)
    moved = r.choice(w.shape[0], 200, replace=False)
    new_rows = w[moved] + r.standard_normal((200, w.shape[1])).astype(np.float32)
    # Ten rows moved onto the first query: they become its best.
    new_rows[:10] = q[0] * 1.05
    index.update(moved, new_rows)
    w2 = w.copy()
    w2[moved] = new_rows
    rebuilt = farout.Index(w2, kind=kind, **params)
    a_ids, a_scores = index.search(q[:20], k=10)
    b_ids, b_scores = rebuilt.search(q[:20], k=10)
    exact = brute_force(w2, q[:20], 10)
    assert set(a_ids[0]) == set(exact[0]) == set(b_ids[0])
    if kind != "spherical":  # same structure: the same answers
        np.testing.assert_array_equal(a_ids, b_ids)
        np.testing.assert_array_equal(a_scores, b_scores)
    np.testing.assert_array_equal(index.vectors, w2)


@pytest.mark.parametrize("kind,params", SAVEABLE)
def test_a_saved_and_loaded_index_answers_identically(tmp_path, kind, params):
    w, q = clustered()
    index = farout.Index(w, kind=kind, **params)
    index.search(q[:300], k=10)
    index.update([5, 9], w[[9, 5]])
    index.save(tmp_path / "w.index")
    loaded = farout.Index.load(tmp_path / "w.index")
    assert (len(loaded), loaded.dim, loaded.kind, loaded.params) == (len(index), index.dim, index.kind, index.params)
    for _ in range(2):  # and again, after both calibrate on the same queries
        a, b = index.search(q, k=10), loaded.search(q, k=10)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_float64_and_fortran_order_arrays_are_converted():
    w, q = clustered(n=2_500)
    index = farout.Index(w, kind="exact")
    a = index.search(q, k=7)
    b = farout.Index(np.asfortranarray(w.astype(np.float64)), kind="exact").search(np.asfortranarray(q), k=7)
    np.testing.assert_array_equal(a[0], b[0])


def test_bad_input_raises_the_right_exception(tmp_path):
    w, q = clustered(n=2_500)
    bad = w.copy()
    bad[17, 3] = np.nan
    with pytest.raises(farout.InvalidInput, match="row 17"):
        farout.Index(bad)
    with pytest.raises(ValueError, match="dtype"):
        farout.Index(np.array([["a", "b"]]))
    with pytest.raises(farout.InvalidInput, match="2-D"):
        farout.Index(np.zeros((2, 3, 4), dtype=np.float32))
    with pytest.raises(farout.InvalidInput, match="unknown variant `faiss`"):
        farout.Index(w, kind="faiss")
    with pytest.raises(farout.InvalidInput, match="n_centroid"):
        farout.Index(w, kind="spherical", n_centroid=4)
    with pytest.raises(farout.InvalidInput, match="recall"):
        farout.Index(w, kind="exact", recall=0.5)
    index = farout.Index(w, kind="exact")
    with pytest.raises(farout.InvalidInput, match="columns|values"):
        index.search(q[:, :10], k=5)
    with pytest.raises(farout.InvalidInput, match="k = 0"):
        index.search(q, k=0)
    nan_q = q.copy()
    nan_q[2, 0] = np.inf
    with pytest.raises(farout.InvalidInput, match="row 2"):
        index.search(nan_q, k=5)
    with pytest.raises(farout.InvalidInput, match="given twice|outside"):
        index.update([1, 1], w[:2])
    with pytest.raises(farout.InvalidInput, match="outside"):
        index.update([len(w)], w[:1])
    with pytest.raises(farout.FileError):
        farout.Index.load(tmp_path / "missing.index")
    index.save(tmp_path / "w.index")
    data = bytearray((tmp_path / "w.index").read_bytes())
    data[len(data) // 2] ^= 1
    (tmp_path / "bad.index").write_bytes(bytes(data))
    with pytest.raises(farout.InvalidInput, match="corrupt"):
        farout.Index.load(tmp_path / "bad.index")
    with pytest.raises(farout.InvalidInput, match="hnsw_rs"):
        farout.Index(w, kind="hnsw").save(tmp_path / "h.index")
