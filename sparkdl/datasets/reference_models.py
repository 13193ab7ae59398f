"""Reference models the examples, notebooks and benchmarks train (plain ``torch.nn`` modules).

Example::

    from sparkdl.datasets import lenet5, mlp
    net = lenet5()                  # 1x28x28 images -> 10 logits
    wide = mlp([784, 4096, 4096, 10])
    recommender = MovieRecommender(users=671, items=9066, genres=20)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["lenet5", "mlp", "MovieRecommender", "CrossFeatureRecommender", "HistoryClassifier",
           "train_single_process", "predict_single_process"]


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


def _masked_mean(embedding: nn.Embedding, ids: torch.Tensor, lengths: torch.Tensor
                 ) -> torch.Tensor:
    """Mean of the embeddings of each row's first ``lengths`` ids (zeros for an empty row)."""
    mask = torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths[:, None]
    summed = (embedding(ids) * mask[..., None]).sum(1)
    return summed / lengths.clamp(min=1)[:, None].to(summed.dtype)


class MovieRecommender(nn.Module):
    """Rating prediction from a user id, an item id and the item's genre ids (a variable-length
    input, received as padded ids and lengths): embeddings, then a small MLP.

    Example: ``MovieRecommender(671, 9066, 20)(user, item, genres_padded, genre_lengths)``.
    """

    def __init__(self, users: int, items: int, genres: int, dim: int = 16) -> None:
        super().__init__()
        self.user = nn.Embedding(users, dim)
        self.item = nn.Embedding(items, dim)
        self.genre = nn.Embedding(genres, dim)
        self.head = nn.Sequential(nn.Linear(3 * dim, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, user: torch.Tensor, item: torch.Tensor, genres: torch.Tensor,
                genre_lengths: torch.Tensor) -> torch.Tensor:
        h = torch.cat([self.user(user), self.item(item),
                       _masked_mean(self.genre, genres, genre_lengths)], dim=1)
        return self.head(h).squeeze(1) + 3.5      # ratings centre near 3.5


class CrossFeatureRecommender(nn.Module):
    """Wide and deep rating prediction: the deep part is :class:`MovieRecommender`'s (user,
    item and genre embeddings); the wide part a large hashed table of feature crosses (a
    variable-length id list per rating, 0 is padding), summed per rating by an
    ``nn.EmbeddingBag``; both feed a small MLP. The cross table starts at zero, so a cross never
    trained adds nothing. ``sparse``: every table gives sparse gradients.

    Example: ``CrossFeatureRecommender(671, 9066, 20, 2**21)(user, item, genres, genre_lengths,
    crosses, cross_lengths)``.
    """

    def __init__(self, users: int, items: int, genres: int, cross_rows: int, dim: int = 16,
                 sparse: bool = True) -> None:
        super().__init__()
        self.user = nn.Embedding(users, dim, sparse=sparse)
        self.item = nn.Embedding(items, dim, sparse=sparse)
        self.genre = nn.Embedding(genres, dim, sparse=sparse)
        self.crosses = nn.EmbeddingBag(cross_rows, dim, mode="sum", padding_idx=0,
                                       sparse=sparse)
        nn.init.zeros_(self.crosses.weight)
        self.head = nn.Sequential(nn.Linear(4 * dim, 32), nn.ReLU(), nn.Linear(32, 1))

    def tables(self) -> list[nn.Parameter]:
        """The embedding tables' weights (for SparseAdam; the rest is the head's)."""
        return [self.user.weight, self.item.weight, self.genre.weight, self.crosses.weight]

    def forward(self, user: torch.Tensor, item: torch.Tensor, genres: torch.Tensor,
                genre_lengths: torch.Tensor, crosses: torch.Tensor,
                cross_lengths: torch.Tensor) -> torch.Tensor:
        h = torch.cat([self.user(user), self.item(item),
                       _masked_mean(self.genre, genres, genre_lengths),
                       self.crosses(crosses)], dim=1)
        return self.head(h).squeeze(1) + 3.5


class HistoryClassifier(nn.Module):
    """Liked or not, from the candidate item and the user's recent items (a variable-length
    sequence, received as padded ids and lengths): the mean history embedding next to the
    item's, then a small MLP with two logits.

    Example: ``HistoryClassifier(9066)(item, history_padded, history_lengths)``.
    """

    def __init__(self, items: int, dim: int = 16) -> None:
        super().__init__()
        self.item = nn.Embedding(items, dim)
        self.seen = nn.Embedding(items, dim)
        self.head = nn.Sequential(nn.Linear(2 * dim + 1, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, item: torch.Tensor, history: torch.Tensor,
                history_lengths: torch.Tensor) -> torch.Tensor:
        empty = (history_lengths == 0).to(self.item.weight.dtype)[:, None]
        h = torch.cat([self.item(item), _masked_mean(self.seen, history, history_lengths),
                       empty], dim=1)
        return self.head(h)


def train_single_process(model: nn.Module, inputs: Sequence[Any], target: np.ndarray,
                         loss: Any, lr: float, batch_size: int, epochs: int, seed: int,
                         padding_value: float = 0.0, training_step: Any = None,
                         optimizer: Any = None) -> nn.Module:
    """Plain PyTorch, one process: Adam, ``epochs`` passes in a seeded shuffled order, every
    batch's variable-length inputs (:class:`sparkdl.data.ragged.Ragged`) padded to its longest
    row and followed by their lengths, as sparkdl passes them. The reference the MovieLens
    examples compare sparkdl against. With ``training_step`` (:mod:`sparkdl.training_step`)
    each batch's loss is ``training_step(model, args, target)`` instead of
    ``loss(model(*args), target)``; ``optimizer(model, lr)`` replaces Adam (it may return a
    list of optimizers, stepped in order)."""
    from ..data.ragged import model_arguments

    made = optimizer(model, lr) if optimizer is not None else torch.optim.Adam(
        model.parameters(), lr=lr)
    optimizers = list(made) if isinstance(made, (list, tuple)) else [made]
    rng = np.random.default_rng(seed)
    n = len(target)
    model.train()
    for _ in range(epochs):
        order = rng.permutation(n)
        for lo in range(0, n, batch_size):
            idx = order[lo:lo + batch_size]
            batch = [x.take(idx) if hasattr(x, "offsets") else x[idx] for x in inputs]
            args = [torch.from_numpy(np.asarray(a)) for a in model_arguments(batch,
                                                                             padding_value)]
            for opt in optimizers:
                opt.zero_grad()
            y = torch.from_numpy(target[idx])
            if training_step is None:
                loss(model(*args), y).backward()
            else:
                value = training_step(model, args, y)
                (value[0] / value[1] if isinstance(value, tuple) else value).backward()
            for opt in optimizers:
                opt.step()
    return model


def predict_single_process(model: nn.Module, inputs: Sequence[Any],
                           padding_value: float = 0.0) -> torch.Tensor:
    """``model``'s output on all of ``inputs`` (arrays and :class:`~sparkdl.data.ragged.Ragged`
    inputs, passed as sparkdl passes them), in eval mode without autograd: the single-process
    reference's predictions.

    Example: ``out = predict_single_process(reference, [users, items]).numpy()``.
    """
    from ..data.ragged import model_arguments

    model.eval()
    with torch.no_grad():
        return model(*[torch.from_numpy(np.asarray(a))
                       for a in model_arguments(inputs, padding_value)])
