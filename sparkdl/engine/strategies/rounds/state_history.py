"""Where a rounds fit's inner states are durable, and the rounds since their last durable copy
(driver side).

The partitions' optimizer and scheduler states live beside their shards, on the executors
(:mod:`sparkdl.executor.round_states`). The driver keeps only what rebuilds a lost one: the
place of the durable copies that the tasks write every K rounds (``spark.sparkdl.roundStateEvery``,
default 8; 1 with ``spark.speculation`` or ``spark.sparkdl.shardReplicas`` above 1, so that a
copy of a task on another executor reads its partition's state from the durable copy at once),
and the global start weights and spec of each round since the last copy (K copies of the
weights, not P copies of the state). Where the copies go:

1. the fit's checkpoint directory, when it has one (``<dir>/round-states``): a resumed driver
   finds them there, named by its checkpoint;
2. else ``spark.sparkdl.roundStateDir`` (a directory every executor reaches: a shared path or
   an ``hdfs://``/``s3://`` URI);
3. else, on ``local[...]`` and ``local-cluster[...]`` masters, a temporary directory on the
   driver's machine (removed when the fit ends);
4. else nowhere: the replay starts at the first round (from the fit's bundle), and the driver
   keeps every round's weights.

The driver keeps the rounds' weights in files on its local disk, read back memory-mapped.

Example::

    history = StateHistory.for_fit(ctx)
    spec = history.stamp(spec)                     # the round's durable settings
    history.committed(spec, start_weights)         # after the round's outer step
    replay = history.replay()                      # when a partition's state is lost
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from typing import Any

import numpy as np
import torch

from ....errors import InvalidArgumentError
from ....executor.live_runs import new_key
from ....executor.round_states import DurableStates
from ....executor.round_task import RoundReplay, RoundSpec
from ....spark_settings import SHARD_REPLICAS, is_local_master, spark_setting
from ....storage.local_paths import local_path

__all__ = ["StateHistory", "ROUND_STATE_DIR", "ROUND_STATE_EVERY", "spec_to_plain",
           "spec_from_plain"]

log = logging.getLogger("sparkdl")

ROUND_STATE_DIR = "spark.sparkdl.roundStateDir"
ROUND_STATE_EVERY = "spark.sparkdl.roundStateEvery"
DEFAULT_EVERY = 8


class StateHistory:
    """A rounds fit's durable copies and the rounds since the last (see the module docstring).
    ``durable``: the copies' directory ("" for none); ``every``: K."""

    def __init__(self, durable: str, every: int, temporary: str | None = None) -> None:
        self.durable = durable
        self.every = every
        self.fit_key = new_key("states")
        """Names this driver's states beside the shards (a resumed driver has its own)."""
        self.round_index = 0
        self.durable_iteration: int | None = None   # the last durable copy's round start
        self.rounds: list[tuple[RoundSpec, Any]] = []
        self._temporary = temporary                 # a directory of ours, removed at close
        self._weights_dir: str | None = None        # the kept weights, without durable copies

    @classmethod
    def for_fit(cls, ctx: Any) -> "StateHistory":
        """The history of ``ctx``'s fit: its durable directory chosen as the module docstring
        says; an InvalidArgumentError names a bad ``spark.sparkdl.roundStateEvery``."""
        sc = getattr(ctx.runner, "spark_context", None)
        setting = (lambda key: spark_setting(sc, key)) if sc is not None else (lambda key: "")
        copies = (setting("spark.speculation").strip().lower() == "true" or
                  (setting(SHARD_REPLICAS).strip() or "1") != "1")
        raw = (setting(ROUND_STATE_EVERY) or str(1 if copies else DEFAULT_EVERY)).strip()
        try:
            every = int(raw)
        except ValueError:
            every = 0
        if every < 1:
            raise InvalidArgumentError(
                f"{ROUND_STATE_EVERY}={raw!r}: give every how many rounds the executors copy "
                f"their partitions' optimizer states where checkpoints go, a whole number from 1 "
                f"(the default: {DEFAULT_EVERY}); a lost state replays at most that many rounds")
        if ctx.checkpoints is not None:
            return cls(_qualified(sc, ctx.checkpoints.store.path.rstrip("/") + "/round-states"),
                       every)
        configured = setting(ROUND_STATE_DIR).strip()
        if configured:
            return cls(_qualified(sc, configured.rstrip("/") + "/" + new_key("fit")), every)
        master = str(sc.master) if sc is not None else "local"
        if is_local_master(master) or master.startswith("local-cluster"):
            temporary = tempfile.mkdtemp(prefix="sparkdl-round-states-")
            return cls(temporary, every, temporary)
        log.info("local rounds without a checkpoint directory or %s: a lost partition state "
                 "replays every round from the first (the driver keeps each round's weights on "
                 "its local disk)", ROUND_STATE_DIR)
        return cls("", every)

    # ------------------------------------------------------------------ rounds
    def stamp(self, spec: RoundSpec) -> RoundSpec:
        """``spec`` with the fit's state settings for the next round."""
        return dataclasses.replace(spec, fit_key=self.fit_key, round_index=self.round_index,
                                   initial=self.round_index == 0, durable=self.durable,
                                   every=self.every if self.durable else 0)

    def committed(self, spec: RoundSpec, start: np.ndarray) -> None:
        """The round of ``spec`` (started from ``start``) committed: the durable copies it
        wrote (the first round's starting states; every K-th round's states after it) are the
        new replay start."""
        if self.durable and spec.initial:       # the tasks copied their starting states
            self.durable_iteration = spec.iterations[0]
            self._forget()
        self.rounds.append((spec, self._kept(spec, start)))
        self.round_index += 1
        if self.durable and self.round_index % self.every == 0:   # and their states after it
            previous = self.durable_iteration
            self.durable_iteration = spec.next_iteration
            self._forget()
            if previous is not None:           # the copy before: no checkpoint needs it now
                DurableStates(self.durable).drop_before(previous)

    def _kept(self, spec: RoundSpec, start: np.ndarray) -> Any:
        """The weights kept for a replay, in a file on the driver's disk (read back
        memory-mapped): not K copies of the weights in the driver's memory."""
        if self._weights_dir is None:
            self._weights_dir = tempfile.mkdtemp(prefix="sparkdl-round-weights-")
        path = os.path.join(self._weights_dir, f"it-{spec.iterations[0]:010d}.npy")
        np.save(path, start)
        return path

    def _forget(self) -> None:
        """Drop the kept rounds (a durable copy covers them) and their weights' files."""
        for _, kept in self.rounds:
            if isinstance(kept, str) and os.path.exists(kept):
                os.remove(kept)
        self.rounds = []

    def replay(self) -> RoundReplay:
        """What rebuilds a partition's state at the next round's start."""
        rounds = [(spec, np.load(w, mmap_mode="r") if isinstance(w, str) else w)
                  for spec, w in self.rounds]
        if self.durable_iteration is None:
            return RoundReplay(0, True, rounds)
        return RoundReplay(self.durable_iteration, False, rounds)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Plain values and tensors: the durable copies' place and round, the rounds since."""
        return {"durable": self.durable, "every": self.every, "round_index": self.round_index,
                "durable_iteration": self.durable_iteration,
                "rounds": [{"spec": spec_to_plain(spec), "weights": torch.from_numpy(
                    np.array(np.load(w, mmap_mode="r") if isinstance(w, str) else w))}
                    for spec, w in self.rounds]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint's history: the next round rebuilds every partition's state from the
        durable copies it names."""
        if not state.get("durable") and state.get("durable_iteration") is not None:
            raise InvalidArgumentError("a rounds checkpoint names no durable states")
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)
            self._temporary = None
        self.durable = str(state["durable"])
        self.every = int(state["every"])
        self.round_index = int(state["round_index"])
        it = state["durable_iteration"]
        self.durable_iteration = None if it is None else int(it)
        self.rounds = [(spec_from_plain(r["spec"]), r["weights"].numpy())
                       for r in state["rounds"]]

    def close(self) -> None:
        """Remove the directories of this driver's own (a temporary durable one, the kept
        weights)."""
        for directory in (self._temporary, self._weights_dir):
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)
        self._temporary = self._weights_dir = None


def spec_to_plain(spec: RoundSpec) -> dict[str, Any]:
    """A round's spec as tensors and plain values (a checkpoint's)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.ascontiguousarray(value))
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def spec_from_plain(plain: dict[str, Any]) -> RoundSpec:
    """The spec :func:`spec_to_plain` gave."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(RoundSpec):
        if f.name not in plain:
            continue
        value = plain[f.name]
        if isinstance(value, torch.Tensor):
            value = value.numpy()
        elif isinstance(value, list):
            value = tuple(value)
        values[f.name] = value
    return RoundSpec(**values)


def _qualified(sc: Any, path: str) -> str:
    """``path`` as every executor reads it: a local path made absolute on the driver (plain
    paths resolve against Hadoop's default file system, as the checkpoints' do)."""
    if sc is not None and local_path(path) is not None and ":" not in path.split("/")[0]:
        try:
            jvm = sc._jvm
            hpath = jvm.org.apache.hadoop.fs.Path(path)
            fs = hpath.getFileSystem(sc._jsc.hadoopConfiguration())
            path = str(fs.makeQualified(hpath).toString())
        except Exception:  # noqa: BLE001 - no JVM (a test double): the driver's local path
            pass
    local = local_path(path)
    return local if local is not None else path
