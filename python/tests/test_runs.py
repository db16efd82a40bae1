import os
import signal
import threading
import time

import numpy as np
import pytest

import farout
from conftest import ROOT


def tiny_face(**extra):
    """A small synthetic face-head config, as a dict of TOML tables."""
    config = {
        "name": "py-face",
        "seed": 3,
        "data": {"format": "synthetic_face", "face": {"n_classes": 50, "n_samples": 2000, "dim": 16}},
        "model": {"encoder": "face_head"},
        "output": {"estimator": "softmax"},
        "train": {"epochs": 2, "batch_size": 64},
        "log": {"progress": False},
    }
    config.update(extra)
    return config


def test_train_then_evaluate_a_dict_config(in_tmp):
    summary = farout.train(tiny_face())
    assert summary["name"] == "py-face" and summary["epochs"] == 2
    metrics = farout.evaluate(tiny_face())
    assert metrics["p@1"] == pytest.approx(summary["metrics"]["p@1"], abs=1e-12)


def test_a_second_run_needs_overwrite_and_overrides_apply(in_tmp):
    farout.train(tiny_face())
    with pytest.raises(farout.InvalidInput, match="already holds a run"):
        farout.train(tiny_face())
    s = farout.train(tiny_face(), overrides={"train.epochs": 1}, overwrite=True)
    assert s["epochs"] == 1


def test_config_errors_name_the_key(in_tmp):
    with pytest.raises(farout.InvalidInput, match="epochs"):
        farout.train(tiny_face(), overrides=["train.epochs=-1"])
    with pytest.raises(farout.InvalidInput, match="estimator"):
        farout.train(tiny_face(output={"estimator": "magic"}))
    with pytest.raises(farout.FileError, match="no-such.toml"):
        farout.train("no-such.toml")
    with pytest.raises(farout.InvalidInput, match="path"):
        farout.train(42)


def test_ctrl_c_stops_between_steps_and_keeps_the_checkpoint(in_tmp):
    # Far more steps than can run before the signal, however fast the machine.
    config = tiny_face(train={"epochs": 1_000_000, "batch_size": 64})
    took = interrupt_after(1.5, lambda: farout.train(config), "checkpoint")
    assert took < 60
    assert (in_tmp / "runs" / "py-face" / "checkpoint").is_dir()
    # The run continues from it.
    s = farout.train(config, overrides={"train.epochs": 1}, resume=True)
    assert s["steps"] > 0


def interrupt_after(seconds, call, match):
    """Runs ``call()`` with SIGINT sent after ``seconds``; it must raise KeyboardInterrupt whose
    message matches ``match``, well before the work it was given could end. Python's own SIGINT
    handler is installed for the call: a process started in the background by a shell inherits
    SIGINT ignored, and Python then installs none, so the signal would do nothing. Should the
    signal still be lost, a second one 60 s later ends the work, so the test fails instead of
    hanging."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    lost = []

    def backstop():
        lost.append(True)
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    guard = threading.Timer(seconds + 60, backstop)
    timer.start()
    guard.start()
    t0 = time.time()
    try:
        with pytest.raises(KeyboardInterrupt, match=match):
            call()
    finally:
        timer.cancel()
        guard.cancel()
        signal.signal(signal.SIGINT, previous)
    assert not lost, "the first SIGINT did not stop the work"
    return time.time() - t0


def tiny_skipgram(**train):
    return {
        "name": "py-sg",
        "data": {"format": "text", "synthetic": {"words": 500, "tokens": 200_000, "topics": 10}},
        "model": {"encoder": "skip_gram", "skip_gram": {"dim": 16}},
        "output": {"estimator": "negative_sampling"},
        "train": {"threads": 1, **train},
        "log": {"progress": False},
    }


def test_ctrl_c_stops_skip_gram_mid_epoch_and_keeps_the_checkpoint(in_tmp):
    # A thousand epochs of 200,000 words: minutes on any machine; the stop comes mid-epoch.
    took = interrupt_after(1.5, lambda: farout.train(tiny_skipgram(epochs=1000)), "words; the checkpoint in")
    assert took < 60
    assert (in_tmp / "runs" / "py-sg" / "checkpoint" / "state.json").exists()
    s = farout.train(tiny_skipgram(epochs=2), resume=True)
    assert s["words"] > 0


def test_ctrl_c_stops_a_linear_fit_between_labels(in_tmp):
    import scipy.sparse as sp

    # 100,000 one-sample labels on 3,000 rows: a minute or more of label problems anywhere.
    rng = np.random.default_rng(0)
    x = sp.random(3000, 400, density=0.05, format="csr", random_state=1, dtype=np.float32)
    y = [[int(j) for j in rng.choice(100_000, 40, replace=False)] for _ in range(3000)]
    model = farout.linear.DiSMEC()
    took = interrupt_after(1.0, lambda: model.fit(x, y), "labels; no model was kept")
    assert took < 30
    with pytest.raises(farout.InvalidInput, match="is not fitted"):
        model.predict(x[:2])


def test_compare_returns_one_row_per_run(in_tmp):
    a = tiny_face(name="cmp-softmax")
    b = tiny_face(name="cmp-sampled", output={"estimator": "sampled_softmax", "n_samples": 10})
    rows = farout.compare([a, b], out="cmp")
    assert len(rows) == 2
    assert (in_tmp / "cmp" / "summary.md").exists()
