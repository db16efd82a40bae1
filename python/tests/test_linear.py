import inspect
import json
import subprocess

import numpy as np
import pytest

import farout
from farout import linear
from conftest import ROOT

sparse = pytest.importorskip("scipy.sparse")


def toy(n=300, d=40, k=6, seed=0):
    """Separable multi-label data: label j fires when feature j is large."""
    rng = np.random.default_rng(seed)
    X = rng.random((n, d)).astype(np.float32)
    Y = [[j for j in range(k) if X[i, j] > 0.7] or [int(np.argmax(X[i, :k]))] for i in range(n)]
    return X, Y


@pytest.mark.parametrize("cls", [linear.DiSMEC, linear.PPDSparse, linear.MEMOIR])
def test_defaults_are_the_configs(cls):
    rust = json.loads(farout._farout.linear_defaults(cls._solver))
    rust.pop("solver")
    sig = inspect.signature(cls.__init__).parameters
    py = {linear._KEY_OF_ARG.get(n, n): p.default for n, p in sig.items() if n != "self"}
    if "oracle" in py:  # None stands for the default oracle table
        assert py.pop("oracle") is None
        rust.pop("oracle")
    assert py == rust


def test_fit_predict_dense_sparse_and_lists_agree():
    X, Y = toy()
    a = linear.DiSMEC().fit(X, Y)
    b = linear.DiSMEC().fit(sparse.csr_matrix(X), Y)
    la, sa = a.predict(X, k=3)
    lb, sb = b.predict(sparse.csr_matrix(X), k=3)
    assert la.dtype == np.int64 and sa.dtype == np.float32 and la.shape == (300, 3)
    np.testing.assert_array_equal(la, lb)
    np.testing.assert_array_equal(sa, sb)
    assert np.all(np.diff(sa, axis=1) <= 0), "best first"
    assert a.evaluate(X, Y)["p@1"] > 0.9
    # k above the number of labels is capped
    assert a.predict(X[:2], k=100)[0].shape == (2, 6)


def test_get_set_params_and_sklearn_selection():
    clf = linear.PPDSparse(lambda_=0.1)
    assert clf.get_params()["lambda_"] == 0.1
    clf.set_params(tau=2.0)
    assert clf.tau == 2.0
    with pytest.raises(farout.InvalidInput, match="no parameter"):
        clf.set_params(cee=1)
    ms = pytest.importorskip("sklearn.model_selection")
    X, Y = toy()
    search = ms.GridSearchCV(linear.DiSMEC(), {"c": [0.1, 1.0]}, cv=2).fit(sparse.csr_matrix(X), Y)
    assert search.best_params_["c"] in (0.1, 1.0)


def test_save_load_round_trip_and_no_overwrite(tmp_path):
    X, Y = toy()
    clf = linear.DiSMEC().fit(X, Y)
    p = tmp_path / "linear.model"
    clf.save(p)
    with pytest.raises(farout.FileError, match="exists"):
        clf.save(p)
    back = linear.DiSMEC.load(p)
    np.testing.assert_array_equal(back.predict(X)[0], clf.predict(X)[0])
    with pytest.raises(farout.FileError):
        linear.DiSMEC.load(tmp_path / "missing.model")


def test_bad_input_raises_clear_errors():
    X, Y = toy()
    clf = linear.DiSMEC()
    with pytest.raises(farout.InvalidInput, match="not fitted"):
        clf.predict(X)
    bad = X.copy()
    bad[7, 3] = np.nan
    with pytest.raises(farout.InvalidInput, match="row 7, column 3"):
        clf.fit(bad, Y)
    with pytest.raises(ValueError, match="rows but Y has"):
        clf.fit(X[:10], Y)
    with pytest.raises(farout.InvalidInput, match="2-D"):
        clf.fit(X[0], Y)
    with pytest.raises(farout.InvalidInput, match="dtype"):
        clf.fit(np.array([["a"]]), [[0]])
    with pytest.raises(farout.InvalidInput, match="label"):
        clf.fit(X, [["x"]] * len(X))
    with pytest.raises(farout.InvalidInput, match="c"):
        linear.DiSMEC(c=-1.0).fit(X, Y)
    clf.fit(X, Y)
    with pytest.raises(farout.InvalidInput, match="features"):
        clf.predict(np.ones((2, 100), dtype=np.float32))
    with pytest.raises(farout.InvalidInput, match="k"):
        clf.predict(X, k=0)
    # F-order and float64 input are converted (documented), giving the same answer
    np.testing.assert_array_equal(clf.predict(np.asfortranarray(X.astype(np.float64)))[0], clf.predict(X)[0])


def test_tfidf_is_the_cli_transform():
    X = sparse.csr_matrix(np.array([[1, 0, 2], [0, 0, 1], [3, 1, 0]], dtype=np.float32))
    t = linear.TfIdf().fit(X)
    df = np.array([2, 1, 2])
    np.testing.assert_allclose(t.idf_, np.log((1 + 3) / (1 + df)) + 1, rtol=1e-6)
    Z = t.transform(X).toarray()
    np.testing.assert_allclose(np.linalg.norm(Z, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(linear.tfidf(X, normalize=False).toarray(), X.toarray() * t.idf_, rtol=1e-6)


def test_bibtex_dismec_equals_the_cli(bibtex, in_tmp, farout_cli):
    """A DiSMEC model fitted in Python gives the CLI's P@1/3/5, and each loads in the other."""
    config = ROOT / "configs" / "bibtex-dismec.toml"
    X, Y = linear.read_xmc(bibtex / "train.txt")
    Xt, Yt = linear.read_xmc(bibtex / "test.txt")
    prep = linear.TfIdf().fit(X)
    clf = linear.DiSMEC(init="msi").fit(prep.transform(X), Y)
    py = clf.evaluate(prep.transform(Xt), Yt)

    out = subprocess.run([farout_cli, "train", str(config)], capture_output=True, text=True, check=True)
    cli = json.loads(out.stdout)["metrics"]
    for k in ("p@1", "p@3", "p@5"):
        assert abs(py[k] - cli[k]) <= 1e-9, (k, py[k], cli[k])

    # The CLI's model loads in Python and predicts the same; Python's evaluates in the CLI.
    cli_model = linear.DiSMEC.load(in_tmp / "runs" / "bibtex-dismec" / "checkpoint" / "linear.model")
    np.testing.assert_array_equal(cli_model.predict(prep.transform(Xt))[0], clf.predict(prep.transform(Xt))[0])
    (in_tmp / "mine").mkdir()
    clf.save(in_tmp / "mine" / "linear.model")
    out = subprocess.run(
        [farout_cli, "eval", str(config), "--checkpoint", str(in_tmp / "mine")], capture_output=True, text=True, check=True
    )
    assert abs(json.loads(out.stdout)["p@1"] - py["p@1"]) <= 1e-9

    # The library path (farout.train) is the CLI's too.
    lib = farout.train(config, overwrite=True)["metrics"]
    assert abs(lib["p@1"] - cli["p@1"]) <= 1e-9
