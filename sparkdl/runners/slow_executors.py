"""Which executors are slow, learned from the training tasks' own timings (driver side).

An executor is *slow in an iteration* when

* the median time its tasks took (their function, from start to vector: ``finished_at -
  started_at`` of the reports) is over ``factor`` times the iteration's lower median task time
  and at least ``min_excess_s`` over it; or
* a later attempt of a task it held won: a speculative copy or a retry finished first on the
  partition's other shard holder (an attempt that lost never reports, so this is how a
  straggler that speculation relieves is seen).

An executor slow in ``iterations`` iterations in a row is *avoided* for ``cooldown`` iterations:
its partitions' tasks go to their other holders (:mod:`sparkdl.runners.shard_placement`). Then
it gets its share back on probation: slow again in its first iteration back, it is avoided again
for twice as long (at most ``max_cooldown``); not slow, its probation ends. Moving a task never
changes a result: every holder of a shard computes the same vector.

Example::

    slow = SlowExecutors()
    events = slow.observe([TaskTiming(0, "executor_h1_1", 1.2, 0), ...], holders)
    slow.avoided()        # {"executor_h1_1"} after three slow iterations
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SlowRule", "SlowExecutors", "TaskTiming"]


@dataclass(frozen=True)
class SlowRule:
    """The documented thresholds (README, "Stragglers")."""

    factor: float = 2.0
    min_excess_s: float = 0.2
    iterations: int = 3
    cooldown: int = 10
    max_cooldown: int = 80


@dataclass(frozen=True)
class TaskTiming:
    """One partition's winning attempt: where it ran, how long its function took, which
    attempt it was (0: the first)."""

    partition: int
    executor: str
    seconds: float
    attempt: int


def lower_median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


@dataclass
class SlowExecutors:
    """The state of the rule above over a run's iterations (see the module docstring)."""

    rule: SlowRule = field(default_factory=SlowRule)
    iteration: int = 0
    streak: dict[str, int] = field(default_factory=dict)
    avoided_until: dict[str, int] = field(default_factory=dict)
    next_cooldown: dict[str, int] = field(default_factory=dict)
    probation: set[str] = field(default_factory=set)
    avoidances: int = 0

    def avoided(self) -> set[str]:
        """The executors whose tasks go elsewhere in the coming iteration."""
        return {e for e, until in self.avoided_until.items() if until > self.iteration}

    def slow_in(self, timings: list[TaskTiming], holders: dict[int, list[str]]) -> set[str]:
        """The executors slow in one iteration (the two signs of the module docstring)."""
        slow: set[str] = set()
        durations = [t.seconds for t in timings if t.executor]
        if durations:
            baseline = lower_median(durations)
            by_executor: dict[str, list[float]] = {}
            for t in timings:
                if t.executor:
                    by_executor.setdefault(t.executor, []).append(t.seconds)
            for executor, seconds in by_executor.items():
                typical = lower_median(seconds)
                if typical > self.rule.factor * baseline and \
                        typical > baseline + self.rule.min_excess_s:
                    slow.add(executor)
        for t in timings:
            if t.attempt > 0 and t.executor:
                others = [h for h in holders.get(t.partition, []) if h != t.executor]
                if len(others) == 1:       # the only other holder ran the attempt that lost
                    slow.add(others[0])
        return slow

    def observe(self, timings: list[TaskTiming], holders: dict[int, list[str]]) -> list[str]:
        """Learn from one iteration's winning attempts; what changed, for the log."""
        events: list[str] = []
        slow = self.slow_in(timings, holders)
        seen = {t.executor for t in timings if t.executor} | slow
        avoided = self.avoided()
        for executor in sorted(seen - avoided):
            if executor not in slow:
                self.streak[executor] = 0
                if executor in self.probation:
                    self.probation.discard(executor)
                    self.next_cooldown.pop(executor, None)
                    events.append(f"executor {executor} is no longer slow")
                continue
            self.streak[executor] = self.streak.get(executor, 0) + 1
            again = executor in self.probation
            if not again and self.streak[executor] < self.rule.iterations:
                continue
            healthy = seen - avoided - slow
            if not healthy:            # never avoid every executor that is working
                continue
            cooldown = self.next_cooldown.get(executor, self.rule.cooldown)
            self.avoided_until[executor] = self.iteration + 1 + cooldown
            self.next_cooldown[executor] = min(2 * cooldown, self.rule.max_cooldown)
            self.probation.add(executor)
            self.streak[executor] = 0
            self.avoidances += 1
            when = ("its first iteration back" if again else
                    f"{self.rule.iterations} iterations in a row")
            events.append(f"executor {executor} was slow in {when}: its partitions' tasks go "
                          f"to other executors for {cooldown} iterations")
        self.iteration += 1
        for executor, until in sorted(self.avoided_until.items()):
            if until == self.iteration:
                events.append(f"executor {executor} gets its partitions back (on probation)")
        return events
