import numpy as np
import pytest

import farout


def softmax_reference(W, b, phi, y):
    """Mean softmax cross-entropy and the gradient of the summed loss with respect to phi."""
    z = phi @ W.T + b
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y]).mean()
    p[np.arange(len(y)), y] -= 1.0
    return loss, p @ W


def batch(n, d, k, seed):
    rng = np.random.default_rng(seed)
    phi = rng.normal(size=(n, d)).astype(np.float32)
    phi /= np.linalg.norm(phi, axis=1, keepdims=True)
    return phi, rng.integers(0, k, size=n)


def test_softmax_step_is_the_numpy_reference():
    layer = farout.OutputLayer(300, 16, estimator="softmax", layer={"init_std": 0.5}, seed=4)
    phi, y = batch(32, 16, 300, 0)
    W, b = layer.weights.astype(np.float64), layer.bias.astype(np.float64)
    loss, grad = layer.step(phi, y)
    ref_loss, ref_grad = softmax_reference(W, b, phi.astype(np.float64), y)
    assert grad.shape == (32, 16) and grad.dtype == np.float32
    assert abs(loss - ref_loss) <= 1e-5 * max(1.0, abs(ref_loss))
    np.testing.assert_allclose(grad, ref_grad, atol=1e-5, rtol=1e-5)
    assert layer.steps == 1
    assert not np.array_equal(layer.weights, W.astype(np.float32)), "the step updates W"


def test_ldgs_gradient_is_close_to_the_exact_one():
    k, d = 20_000, 32
    layer = farout.OutputLayer(k, d, estimator="ldgs", loss="softmax", top=100, layer={"init_std": 4.0}, seed=2)
    phi, y = batch(64, d, k, 1)
    W, b = layer.weights.astype(np.float64), layer.bias.astype(np.float64)
    _, grad = layer.step(phi, y)
    _, ref = softmax_reference(W, b, phi.astype(np.float64), y)
    cos = float((grad.ravel() @ ref.ravel()) / (np.linalg.norm(grad) * np.linalg.norm(ref)))
    assert cos >= 0.95, cos


def test_multi_label_scores_save_and_load(tmp_path):
    layer = farout.OutputLayer(50, 8, estimator="margin", layer={"init_std": 0.3})
    phi, _ = batch(10, 8, 50, 3)
    layer.step(phi, [[1, 2], [3], [4, 5, 6], [7], [8], [9], [10], [11], [12], [13]])
    ids, scores = layer.scores(phi, k=5)
    assert ids.shape == (10, 5) and np.all(np.diff(scores, axis=1) <= 0)
    exact = phi @ layer.weights.T + layer.bias
    np.testing.assert_array_equal(ids[:, 0], exact.argmax(axis=1))
    layer.save(tmp_path / "layer")
    back = farout.OutputLayer.load(tmp_path / "layer")
    np.testing.assert_array_equal(back.weights, layer.weights)
    assert back.steps == layer.steps
    # Training continues identically from the saved state.
    a, _ = layer.step(phi, list(range(10)))
    b, _ = back.step(phi, list(range(10)))
    assert a == b


def test_a_saved_ldgs_layer_continues_with_its_index(tmp_path):
    k, d = 5_000, 16
    layer = farout.OutputLayer(k, d, estimator="ldgs", top=50, layer={"init_std": 2.0}, seed=2)
    for s in range(4):
        layer.step(*batch(32, d, k, s))
    layer.save(tmp_path / "layer")
    assert (tmp_path / "layer" / "index.bin").exists()
    back = farout.OutputLayer.load(tmp_path / "layer")
    for s in range(4, 8):
        a, ga = layer.step(*batch(32, d, k, s))
        b, gb = back.step(*batch(32, d, k, s))
        assert a == b
        np.testing.assert_array_equal(ga, gb)
    np.testing.assert_array_equal(back.weights, layer.weights)


def test_bad_input_is_refused():
    layer = farout.OutputLayer(10, 4, estimator="softmax")
    phi = np.zeros((3, 4), dtype=np.float32)
    with pytest.raises(farout.InvalidInput, match="columns"):
        layer.step(np.zeros((3, 5)), [0, 1, 2])
    with pytest.raises(farout.InvalidInput, match="outside"):
        layer.step(phi, [0, 1, 10])
    bad = phi.copy()
    bad[1, 2] = np.inf
    with pytest.raises(farout.InvalidInput, match="row 1, column 2"):
        layer.step(bad, [0, 1, 2])
    with pytest.raises(farout.InvalidInput, match="label sets"):
        layer.step(phi, [0, 1])
    with pytest.raises(farout.InvalidInput, match="unknown variant `magic`, expected one of `softmax`"):
        farout.OutputLayer(10, 4, estimator="magic")
    with pytest.raises(farout.InvalidInput, match="n_classes"):
        farout.OutputLayer(0, 4)
    with pytest.raises(farout.InvalidInput):
        farout.OutputLayer(10**12, 10**6)
