"""Where each training shard is held, and where each partition's task is sent (driver side).

With ``spark.sparkdl.shardReplicas`` r >= 2 every training shard is held by r executors: the
one whose build task made it (its *primary*) and r - 1 chosen by :meth:`ShardPlacement.wanted`
(other hosts first, the executors holding fewest shards first), built by a replica job
(:meth:`sparkdl.runners.cached_rdd.CachedData._replica_job`). The iteration jobs then run over
an RDD whose partition ``i`` prefers every healthy holder of shard ``i``
(:mod:`sparkdl.runners.targeted_rdd`), so a task, its speculative copy or its retry starts at
once on whichever holder has a free core. An executor the tasks' timings show slow
(:mod:`sparkdl.runners.slow_executors`) is left out of those preferences while it is avoided; a
partition held only by avoided executors goes to another healthy executor, which builds the
shard (a placement miss, filled) and then holds it. Holders on executors that have left are
forgotten, and replicas are built again until each shard has r holders.

Example::

    placement = ShardPlacement(2)
    placement.hold(0, "executor_h0_0")
    placement.preferences(1, ["executor_h0_0", "executor_h1_1"])     # [["executor_h0_0"]]
    placement.wanted({0: 40}, ["executor_h0_0", "executor_h1_1"])     # {0: "executor_h1_1"}
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .slow_executors import SlowExecutors, SlowRule

__all__ = ["ShardPlacement", "executor_host", "executor_id"]


def executor_host(location: str) -> str:
    """The host of ``executor_<host>_<id>``."""
    return location[len("executor_"):].rsplit("_", 1)[0]


def executor_id(location: str) -> str:
    """The executor id of ``executor_<host>_<id>``."""
    return location.rsplit("_", 1)[1]


@dataclass
class ShardPlacement:
    """Holders of each partition's shard, in the order they got it (see the module docstring)."""

    replicas: int
    rule: SlowRule = field(default_factory=SlowRule)
    holders: dict[int, list[str]] = field(default_factory=dict)
    slow: SlowExecutors = field(init=False)

    def __post_init__(self) -> None:
        self.slow = SlowExecutors(self.rule)

    def hold(self, partition: int, location: str) -> None:
        """``location`` holds shard ``partition`` (a build, a replica or a fill ran there)."""
        if location and location not in self.holders.setdefault(partition, []):
            self.holders[partition].append(location)

    def forget_lost(self, alive: list[str]) -> list[str]:
        """Forget the holders that are not among the ``alive`` executors; those lost."""
        ids = {executor_id(a) for a in alive}
        lost: set[str] = set()
        for partition, where in self.holders.items():
            lost.update(h for h in where if executor_id(h) not in ids)
            self.holders[partition] = [h for h in where if executor_id(h) in ids]
        return sorted(lost)

    def preferences(self, num_partitions: int, alive: list[str]) -> list[list[str]]:
        """Where each partition's task should run: its healthy holders; else (every holder
        avoided or lost) one healthy executor, chosen by partition number; else its holders."""
        avoided = self.slow.avoided()
        healthy = [a for a in alive if a not in avoided]
        prefs = []
        for partition in range(num_partitions):
            held = self.holders.get(partition, [])
            good = [h for h in held if h not in avoided]
            if not good and healthy:
                good = [healthy[partition % len(healthy)]]
            prefs.append(good or held)
        return prefs

    def wanted(self, counts: dict[int, int], alive: list[str]) -> dict[int, str]:
        """The replicas to build, ``{partition: executor}``: every non-empty partition with
        fewer than ``replicas`` holders gets one more on an alive executor that does not hold
        it, on another host than its holders where there is one, holding fewest shards."""
        load = {a: 0 for a in alive}
        for where in self.holders.values():
            for h in where:
                if h in load:
                    load[h] += 1
        targets: dict[int, str] = {}
        for partition in sorted(counts):
            held = self.holders.get(partition, [])
            if counts[partition] == 0 or len(held) >= self.replicas:
                continue
            free = [a for a in alive if a not in held]
            if not free:
                continue
            hosts = {executor_host(h) for h in held}
            target = min(free, key=lambda a: (executor_host(a) in hosts, load[a], alive.index(a)))
            targets[partition] = target
            load[target] += 1
        return targets
