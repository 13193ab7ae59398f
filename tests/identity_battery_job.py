"""Prints, as one JSON line, the content digest of a battery of objects of many kinds
(tests/test_identity_habits.py runs it in two processes with different ``PYTHONHASHSEED``s and
compares). ``SPARKDL_BATTERY_DRAWS`` moves the global generators by a different amount in each
process, and every object is hashed (``hash()``) and used before its digest, so that no digest
may depend on a process's hash seed, its global random state or an object's caches."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import json
import logging
import math
import operator
import os
import pathlib
import random
import re
import types
import typing
import uuid
from random import gauss
from random import random as uniform

import numpy as np
import pandas as pd
import torch
from numpy.random import rand

from sparkdl.engine.fit.resume.content_digest import content_digest
from sparkdl.metrics import Loss, Top1Accuracy
from sparkdl.triggers import EarlyStopping, MaxEpoch, MinLoss

draws = int(os.environ.get("SPARKDL_BATTERY_DRAWS", "0"))
random.seed(draws)
for _ in range(draws * 3):
    np.random.rand()
    uniform()
torch.manual_seed(0)


class Colour(enum.Enum):
    RED = 1
    BLUE = 2


@dataclasses.dataclass(frozen=True)
class Config:
    lr: float
    layers: tuple[int, ...]
    tags: frozenset[str]


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self) -> None:
        self.a, self.b = {"x", "y", "z"}, [1, 2]


class Point(typing.NamedTuple):
    x: int
    y: float


class Residual(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        return x + self.inner(x) * self.scale


def maker(rate):
    def schedule(epoch):
        return rate ** epoch
    return schedule


def noisy(features, rng):
    if features is None:
        return rand() + uniform() + gauss(0, 1)
    return features


cfg = argparse.Namespace(decay=0.9, seed=draws, name=f"run-{draws}")   # only decay is read
table = pd.DataFrame({"a": [1, 2, 3], "b": ["u", "v", "w"], "c": pd.Categorical(["p", "q", "p"])})
_ = table["a"], table.b.str.len(), table.loc[0], table.describe()
path = pathlib.PurePosixPath("/data/train/part-0")
model = Residual()
tagged = torch.nn.Linear(2, 2)
tagged.register_forward_hook(lambda m, i, o: o * 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

BATTERY: dict[str, typing.Any] = {
    "none": None, "bool": True, "int": 12, "big int": 2 ** 80, "float": 0.1, "nan": math.nan,
    "complex": 1 + 2j, "str": "héllo", "bytes": b"\x00\x01", "bytearray": bytearray(b"ab"),
    "tuple": (1, "a", 2.5), "list": [3, [4, 5]], "dict of str": {"b": 1, "a": 2, "c": 3},
    "dict of tuples": {(1, "x"): "p", (0, "y"): "q"}, "set of str": {"alpha", "beta", "gamma"},
    "frozenset": frozenset({"k", "l", "m"}), "set of tuples": {("a", 1), ("b", 2)},
    "range": range(2, 9, 3), "slice": slice(1, None, 2), "ellipsis": ...,
    "enum": Colour.BLUE, "dataclass": Config(0.1, (64, 32), frozenset({"x", "y"})),
    "slots": Slotted(), "namedtuple": Point(1, 2.0), "namespace": types.SimpleNamespace(a=1),
    "argparse": argparse.Namespace(decay=0.9, epochs=3),
    "ordered dict": collections.OrderedDict(b=1, a=2),
    "counter": collections.Counter("mississippi"), "deque": collections.deque([1, 2], 5),
    "defaultdict": collections.defaultdict(list, {"x": [1]}),
    "date": datetime.date(2026, 11, 28), "datetime": datetime.datetime(2026, 1, 2, 3, 4, 5),
    "timedelta": datetime.timedelta(seconds=90), "decimal": decimal.Decimal("1.25"),
    "fraction": fractions.Fraction(3, 7), "uuid": uuid.UUID(int=7),
    "regex": re.compile(r"[a-z]+\d", re.I), "path": path,
    "numpy array": np.arange(6, dtype=np.float32).reshape(2, 3),
    "numpy object array": np.array(["a", None, 3], dtype=object),
    "numpy scalar": np.float64(2.5), "numpy dtype": np.dtype("int16"),
    "numpy generator": np.random.default_rng(5), "numpy random state": np.random.RandomState(5),
    "random.Random": random.Random(5), "torch tensor": torch.arange(4.0),
    "torch generator": torch.Generator().manual_seed(9), "torch dtype": torch.bfloat16,
    "torch size": torch.Size([2, 3]), "torch device": torch.device("cpu"),
    "module": model, "module with hook": tagged, "optimizer": optimizer,
    "criterion": torch.nn.CrossEntropyLoss(label_smoothing=0.1),
    "lambda": lambda e: 0.95 ** e, "closure": maker(0.9), "partial": functools.partial(maker, 0.5),
    "builtin": len, "math function": math.sqrt, "operator": operator.itemgetter(1, 2),
    "bound method": model.forward, "library function": torch.nn.functional.relu,
    "class": Residual, "library class": torch.nn.Linear, "type": int,
    "global rng functions": noisy, "global rng methods": [uniform, gauss, rand],
    "closure reading args": (lambda e: cfg.decay ** e),
    "pandas frame": table, "pandas series": table["b"], "pandas index": table.columns,
    "logger": logging.getLogger("user.train"), "typing alias": typing.List[int],
    "triggers": MaxEpoch(3) | MinLoss(0.1) | EarlyStopping("Loss", patience=2),
    "metrics": [Loss(), Top1Accuracy()], "weakref target": [model.inner],
}

for value in BATTERY.values():              # caches keyed by the process's hash seed
    try:
        hash(value)
    except TypeError:
        pass
    str(value)

print(json.dumps({name: content_digest(value, name) for name, value in BATTERY.items()}))
