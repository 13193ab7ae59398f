"""How fits meet the data: the strategy, and the loop every strategy's fits run in (driver side).

A *fit* (:mod:`sparkdl.engine.fit`) is what is trained; a *strategy* is how it is run. They meet
in one place, :func:`sparkdl.engine.fit.opening.open_fit`, where the fit asks its strategy the
questions of :class:`~sparkdl.engine.fit.opening.OpeningStrategy`. A new strategy implements,
in one class:

1. ``name``, ``capability``, ``needs`` and ``instead``: what it is called in logs and errors,
   the runner protocol it needs (:mod:`sparkdl.runners.interface`), and in the user's terms
   what that is and what to do without it; a runner without it is refused before any job
   (:func:`check_capability`);
2. ``check(fit, runner)``: the settings it cannot run, refused before any job;
3. ``plan(fit, spec, position)``: which samples each of the fit's iterations takes where;
4. ``resume_key(plan)``: its own settings, which enter the fit's resume key;
5. ``ships_model(fit)`` and ``describe(fit, plan, how)``: whether the model ships when the fit
   opens, and the log line that says how it trains; ``together(runner)`` and
   ``announce(fits)``: whether the runner trains several of its fits at once, and the log line
   for those it does;
6. ``driver(runs, runner, keep_going)``: a :class:`FitsDriver` that runs the opened fits'
   iterations until each ends, with the strategy's own jobs (an object with ``starting``,
   ``iteration`` and ``jobs``: :class:`Jobs`) on the pass's shared ``runner``.

Everything else a fit does (validation, metric schedulers, triggers, best weights, checkpoints,
non-finite stops) is the fit's lifecycle (:mod:`sparkdl.engine.fit.lifecycle`), the same code
under every strategy. The strategies: :mod:`sparkdl.engine.strategies.sync` (one fit per job,
several in a pass) and :mod:`sparkdl.engine.strategies.hop` (model hopping).

Example::

    strategy = SyncStrategy()
    check_capability(strategy, runner)
    runs = [open_fit(fit, FitView(runner, loads), strategy, k) for k, fit in enumerate(fits)]
    driver = strategy.driver(runs, runner, keep_going=True).run()   # .errors, .finished, .jobs
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Protocol, Sequence

from ...errors import InvalidArgumentError
from ..fit.opening import FitRun, OpeningStrategy

__all__ = ["Strategy", "Jobs", "FitsDriver", "check_capability"]

log = logging.getLogger("sparkdl")


class Jobs(Protocol):
    """A strategy's jobs for a set of driven fits."""

    jobs: int
    """How many Spark jobs (or in-process rounds) it ran."""

    def starting(self, active: list[int]) -> None:
        """Before the first job, with the fits that train."""

    def iteration(self, active: list[int]) -> dict[int, Callable[[], bool]]:
        """One job for the ``active`` fits; each fit's completion of it (True: it ended)."""


class Strategy(OpeningStrategy, Protocol):
    """How fits meet the data (see the module docstring for what one implements)."""

    name: str
    capability: type
    needs: str
    """What it needs, in the user's terms (for the refusal)."""
    instead: str
    """What to do where it cannot run ("" when nothing)."""

    def together(self, runner: Any) -> bool:
        """Whether ``runner`` can train several of its fits in one sequence of jobs (else
        they train one after another)."""

    def announce(self, fits: list[int]) -> str | None:
        """The log line for the set's ``fits`` trained together (None: nothing to say)."""

    def driver(self, runs: Sequence[FitRun], runner: Any, keep_going: bool) -> "FitsDriver":
        """The driver that trains the opened ``runs`` on ``runner`` until each fit ends (or
        fails, with ``keep_going``)."""


def check_capability(strategy: Strategy, runner: Any) -> None:
    """Refuse, before any job, a runner that lacks what ``strategy`` needs of it."""
    if not isinstance(runner, strategy.capability):
        raise InvalidArgumentError(
            f"The {strategy.name!r} strategy needs {strategy.needs} (a runner with "
            f"{strategy.capability.__name__}'s jobs); {type(runner).__name__} cannot run it"
            + (f" ({strategy.instead})" if strategy.instead else "") + ".")


class FitsDriver:
    """Runs fits side by side until each one's end trigger fired: before the first job each
    member ``start()``s (False: it had ended already), then every round the strategy's
    ``jobs.iteration`` runs one job for the active fits and each completes it; a fit that ends
    leaves, the others go on. ``members``: objects with ``start``, ``close`` and ``ctx``.
    ``keep_going``: a fit that fails leaves with its error kept in :attr:`errors` (by
    position) and the others go on; else the error is raised at once."""

    def __init__(self, members: Sequence[Any], jobs: Jobs, word: str,
                 keep_going: bool = False) -> None:
        self.members = list(members)
        self.maker = jobs
        self.word = word
        """How the log names what the fits share ("pass", "hop")."""
        self.keep_going = keep_going
        self.errors: dict[int, BaseException] = {}
        self.finished: set[int] = set()
        """The fits that reached their end trigger."""

    @property
    def jobs(self) -> int:
        """The jobs the strategy ran for these fits."""
        return self.maker.jobs

    def run(self) -> "FitsDriver":
        active: list[int] = []
        try:
            for k, member in enumerate(self.members):
                if self._guarded(k, member.start):
                    active.append(k)
                elif k not in self.errors:
                    self.finished.add(k)
            self.maker.starting(active)
            while active:
                completions = self.maker.iteration(active)
                still, left = [], []
                for k in active:
                    ended = self._guarded(k, completions[k])
                    if k in self.errors:
                        continue
                    if not ended:
                        still.append(k)
                        continue
                    self.members[k].close()
                    self.finished.add(k)
                    left.append(k)
                # the completions hold this iteration's results (each a model-sized sum):
                # dropped before the next job collects its own
                del completions
                if left and len(self.members) > 1:
                    log.info("fits %s leave the %s after their iteration %s (%d fits go on)",
                             left, self.word, [self.members[k].ctx.iteration for k in left],
                             len(still))
                active = still
        finally:
            for k in active:
                self.members[k].close()
        return self

    def _guarded(self, k: int, call: Callable[[], bool]) -> bool:
        """``call()``; a failure is raised, or with ``keep_going`` kept (the fit leaves, False
        is returned)."""
        try:
            return call()
        except Exception as exc:
            if not self.keep_going:
                raise
            self.errors[k] = exc
            self.members[k].close()
            log.error("fit %d of the %s failed and leaves it: %s: %s", k, self.word,
                      type(exc).__name__, exc)
            return False
