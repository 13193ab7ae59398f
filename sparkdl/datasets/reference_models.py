"""Reference models the examples, notebooks and benchmarks train (plain ``torch.nn`` modules).

Example::

    from sparkdl.datasets import lenet5, mlp
    net = lenet5()                  # 1x28x28 images -> 10 logits
    wide = mlp([784, 4096, 4096, 10])
"""

from __future__ import annotations

from typing import Sequence

from torch import nn

__all__ = ["lenet5", "mlp"]


def lenet5(num_classes: int = 10) -> nn.Sequential:
    """LeNet-5 for 1x28x28 images: conv 6@5x5 (padded), maxpool 2, conv 16@5x5, maxpool 2,
    fc 120, fc 84, fc ``num_classes``, with ReLU activations."""
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, num_classes))


def mlp(sizes: Sequence[int]) -> nn.Sequential:
    """A ReLU multilayer perceptron with the given layer widths, input first; inputs of any
    shape are flattened. ``mlp([784, 256, 10])`` is the W1 benchmark model."""
    if len(sizes) < 2:
        raise ValueError(f"mlp needs at least an input and an output width, got {list(sizes)}")
    layers: list[nn.Module] = [nn.Flatten()]
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
