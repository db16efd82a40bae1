"""A PyTorch encoder trained through farout's output layer.

farout's `OutputLayer.step` returns the loss and its gradient with respect to the features;
wrapped in a `torch.autograd.Function`, it is the last layer of a PyTorch model, and
`loss.backward()` carries farout's gradient into the encoder. The layer updates its own
weights (W, bias) inside `step`, with its own optimiser, so only the encoder's parameters go
to the PyTorch optimiser.

The script trains the same encoder twice on a synthetic task with many classes, through the
LDGS layer and through the exact softmax layer, for the same steps, and prints the test
accuracy and the time of each:

    pip install torch ./python
    python examples/python/torch_ldgs.py [--classes 20000] [--steps 600]
"""

import argparse
import time

import numpy as np
import torch

import farout


class FaroutLoss(torch.autograd.Function):
    """The mean loss of farout's output layer over a batch of features."""

    @staticmethod
    def forward(ctx, features, labels, layer):
        loss, grad = layer.step(features.detach().cpu().numpy(), labels.cpu().numpy())
        # `grad` is the gradient of the summed loss; the forward returns the mean.
        ctx.save_for_backward(torch.from_numpy(grad) / features.shape[0])
        return features.new_tensor(loss)

    @staticmethod
    def backward(ctx, grad_loss):
        (grad,) = ctx.saved_tensors
        return grad_loss * grad.to(grad_loss.device), None, None


def task(n_classes, dim_in, n_train, n_test, seed=0):
    """Samples around random class means, with a fixed random rotation (the encoder's job)."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_classes, dim_in)).astype(np.float32)
    mix = rng.normal(size=(dim_in, dim_in)).astype(np.float32) / np.sqrt(dim_in)

    def draw(n):
        y = rng.integers(0, n_classes, size=n)
        x = (means[y] + 0.6 * rng.normal(size=(n, dim_in)).astype(np.float32)) @ mix
        return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y)

    return draw(n_train), draw(n_test)


def train(estimator, data, args):
    torch.manual_seed(0)
    (x, y), (xt, yt) = data
    encoder = torch.nn.Sequential(
        torch.nn.Linear(x.shape[1], 256), torch.nn.ReLU(), torch.nn.Linear(256, args.dim)
    )
    layer = farout.OutputLayer(
        args.classes, args.dim, estimator=estimator,
        optimizer={"kind": "adagrad", "lr": 0.5}, layer={"init_std": 0.01},
        # LDGS approximates the softmax loss (the exact layer's) from its top 100 classes.
        **({"loss": "softmax", "top": 100} if estimator == "ldgs" else {}),
    )
    opt = torch.optim.Adam(encoder.parameters(), lr=1e-3)
    start = time.perf_counter()
    for step in range(args.steps):
        idx = torch.randint(0, len(x), (args.batch,))
        loss = FaroutLoss.apply(encoder(x[idx]), y[idx], layer)
        opt.zero_grad()
        loss.backward()
        opt.step()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        ids, _ = layer.scores(encoder(xt).numpy(), k=1)
    accuracy = float((ids[:, 0] == yt.numpy()).mean())
    return accuracy, seconds, float(loss.detach())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--classes", type=int, default=20000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    data = task(args.classes, 32, n_train=20 * args.classes, n_test=5000)
    print(f"{args.classes} classes, features of {args.dim}, {args.steps} steps of {args.batch}")
    for estimator in ("ldgs", "softmax"):
        accuracy, seconds, loss = train(estimator, data, args)
        print(f"{estimator:8s} test accuracy {accuracy:.4f}  last loss {loss:.3f}  {seconds:.1f} s")


if __name__ == "__main__":
    main()
