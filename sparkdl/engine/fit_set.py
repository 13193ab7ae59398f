"""Several fits over one data set, trained together: one Spark job per iteration for all of them
(driver side).

A *fit* is one model with its loss or training step, optimizer(s), scheduler(s), batch size,
triggers, validation and seed: one :class:`sparkdl.DistriOptimizer`. :class:`FitSet` trains a set
of fits over the same training data in *passes*:

* the training data is held once per pass (its shards built by one job);
* every iteration is one job: each task computes, on its cached shard, every fit's share of that
  fit's own global batch (fits with other batch sizes take other batches), and returns their
  vectors one after another (:class:`sparkdl.executor.tasks.PassGradientTask`);
* one AllReduce sums those vectors in partition order, each fit's part exactly as its own job
  would (:func:`sparkdl.transport.allreduce.sum_in_order`);
* the driver steps each fit's optimizer(s), validates and checkpoints it, and asks its triggers;
  a fit whose end (or early-stopping) trigger fires leaves the pass, the others go on.

Each fit's weights are bitwise those of the same fit trained alone (same seed, same
partitions): a pass changes what training costs, never its result. A pass of one fit is exactly
:meth:`sparkdl.DistriOptimizer.optimize`.

Fits share a pass when they train on the same data object with the same data and parameter
dtypes, variable-length inputs, ``allreduce``, ``num_blocks`` and ``device``; the others train in
passes of their own, and the log says why. Within a pass each fit keeps its own ``compression``
(its part of the vector travels through its own codec) and its embedding tables' rows (summed
per fit, by block on the shuffle path; each fit's weights refreshed by its own row deltas).
Under Spark Connect passes run as DataFrame jobs (:mod:`sparkdl.runners.connect_dataframe`),
fits with the same ``exchange_dir``. The iterations of a
pass: :mod:`sparkdl.engine.strategies.sync.pass_jobs`; each fit's view of the pass's runner and
data: :mod:`sparkdl.runners.fit_view`.

Example::

    fits = [DistriOptimizer(make_net(), rdd, loss, make_opt(lr), batch_size=64, seed=0)
            for lr in (0.1, 0.03, 0.01)]
    models = FitSet(fits).run()          # one job per iteration for the three
    fits[0].summary.to_pandas()
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Sequence

import torch

from ..argument_checks import check_choice, check_int
from ..errors import InvalidArgumentError, exception_text
from ..runners.fit_view import FitView
from ..spark_settings import spark_setting
from ..transport.flat_layout import ParamLayout
from .fit.resume.checkpoint_directories import DirectoryHeldError, check_shared_directories
from .fit.checks.task_parallelism import warn_waves
from .fit.opening import FitRun, end_fit, open_fit
from .fit.spec import Fit, fit_of
from .strategies.base import Strategy, check_capability
from .strategies.hop.strategy import HopStrategy
from .strategies.rounds.strategy import RoundsStrategy, uses_rounds
from .strategies.sync.strategy import SyncStrategy
from .strategies.sync.pass_memory import (Budget, Footprint, block_store_warning, budgets,
                                          closure_budget, describe, footprint, plan_passes)

__all__ = ["FitSet", "SharedRunner", "pass_key", "STRATEGIES"]

STRATEGIES = ("together", "hop")
"""How a :class:`FitSet` trains its fits: ``"together"`` (the pass: one data-parallel job per
iteration for all of them, each fit exactly its fit alone) or ``"hop"`` (model hopping: whole
models trained where the data sits, one job per sub-epoch;
:mod:`sparkdl.engine.strategies.hop.jobs`)."""

log = logging.getLogger("sparkdl")


def pass_key(fit: Any, layout: ParamLayout) -> tuple[Any, ...]:
    """What fits must share to train in one pass (:class:`FitSet`; ``layout``: the fit's model's
    as it is now)."""
    options = fit.settings.runner_options
    rounds = (fit.local_steps, fit.sync_warmup) if uses_rounds(fit) else None
    return (id(fit.training_rdd), layout.data_dtype.str, layout.numpy_dtype.str,
            tuple(fit.sequence_inputs), options.allreduce, options.num_blocks, options.device,
            fit.exchange_dir, rounds)


class SharedRunner:
    """The runner and the data it holds, kept from one :class:`FitSet` run to the next (a
    search's batches of fits over the same data): each data object is held once for all of
    them, until :meth:`close` (or the end of a ``with`` block).

    Example::

        with SharedRunner() as shared:
            for batch in batches:
                FitSet([make_fit(s) for s in batch], shared=shared).run()
    """

    def __init__(self) -> None:
        self.runner: Any = None
        self.loads: dict[tuple[Any, ...], Any] = {}

    def runner_for(self, fit: Any) -> Any:
        """The runner for ``fit``'s data: the held one once there is one."""
        from ..runners import runner_for

        if self.runner is None:
            self.runner = runner_for(fit.training_rdd, fit.exchange_dir)
        return self.runner

    def close(self) -> None:
        """Release the data and the runner."""
        if self.runner is not None:
            self.runner.close()
        self.runner, self.loads = None, {}

    def __enter__(self) -> "SharedRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class FitSet:
    """Train several :class:`sparkdl.DistriOptimizer` fits together (see the module docstring).

    Args:
        fits: the fits, each set up as for :meth:`~sparkdl.DistriOptimizer.optimize`
            (validation, checkpoints, MLflow, clipping included). A fit is trained in place, as
            ``optimize`` trains it.
        shared: a :class:`SharedRunner` whose runner and data this set uses and leaves held
            (default: its own, released when the set ends). Its runner must run passes of several fits
            (a classic session or in process), and every fit must train on its data.
        strategy: ``"together"`` (default: passes; each fit bitwise its data-parallel fit
            alone, the model you would train afterwards) or ``"hop"`` (model hopping,
            :mod:`sparkdl.engine.strategies.hop.jobs`: each model trained whole with sequential SGD,
            partition after partition; the faster way to select among many models; a classic
            SparkContext or LocalPartitions).
        hop_seed: with ``"hop"``, seeds the epochs' partition orders
            (:func:`sparkdl.engine.strategies.hop.order.visiting_order`).
        hop_positions: with ``"hop"``, each fit's rotation position (default: its place in
            ``fits``); a model's visiting order, and so its result, depends on its position and
            ``hop_seed`` only: ``FitSet([fit], strategy="hop", hop_positions=[3])`` trains it
            as it trained in fourth place.

    Example::

        fits = [DistriOptimizer(make_net(), rdd, loss, make_opt(lr), batch_size=b, seed=0)
                for lr, b in [(0.1, 64), (0.03, 64), (0.01, 128)]]
        FitSet(fits).run()
        FitSet(other_fits, strategy="hop").run()    # model selection: one job per epoch or less
    """

    def __init__(self, fits: Sequence[Any], shared: SharedRunner | None = None,
                 strategy: str = "together", hop_seed: int = 0,
                 hop_positions: Sequence[int] | None = None) -> None:
        self.fits = list(fits)
        self.shared = shared
        self.strategy = check_choice("strategy", "FitSet", strategy, STRATEGIES)
        self.hop_seed = check_int("hop_seed", "FitSet", hop_seed)
        positions = list(range(len(self.fits))) if hop_positions is None else list(hop_positions)
        if len(positions) != len(self.fits) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in positions):
            raise InvalidArgumentError(
                f"FitSet's hop_positions must be one int >= 0 per fit ({len(self.fits)}); got "
                f"{hop_positions!r}.")
        self.hop_positions = positions
        self.plan: Strategy = (HopStrategy(self.hop_seed, positions) if self.strategy == "hop"
                               else SyncStrategy())
        """How the fits meet the data (:mod:`sparkdl.engine.strategies`)."""
        if not self.fits:
            raise InvalidArgumentError("FitSet needs at least one DistriOptimizer; got none.")
        self.specs: list[Fit] = []
        """Each fit's :class:`~sparkdl.engine.fit.spec.Fit` (what it trains)."""
        for k, fit in enumerate(self.fits):
            spec = fit_of(fit)
            if spec is None:
                raise InvalidArgumentError(
                    f"FitSet's fits must be DistriOptimizer objects; fit {k} is "
                    f"{type(fit).__name__}.")
            self.specs.append(spec)
        if self.strategy == "hop":
            rounds = [k for k, f in enumerate(self.specs) if uses_rounds(f)]
            if rounds:
                raise InvalidArgumentError(
                    f"FitSet(strategy='hop'): fit {rounds[0]} sets local_steps or an "
                    "outer_optimizer, which are for data-parallel fits; model hopping trains "
                    "each model whole with sequential SGD. Use the 'together' strategy.")
        if len({id(f) for f in self.fits}) < len(self.fits):
            raise InvalidArgumentError("FitSet got the same DistriOptimizer twice: a fit trains "
                                       "its model in place, once.")
        if len({id(f.model) for f in self.specs}) < len(self.specs):
            raise InvalidArgumentError("Two fits of a FitSet train the same model object: each "
                                       "fit needs its own model.")
        self.errors: dict[int, BaseException] = {}
        self.passes: list[list[int]] = []
        self.jobs = 0
        """The gradient jobs the passes ran (a closure optimizer's extra evaluations aside)."""
        self.loads = 0
        """The data sets held for the tasks (shards built), over all passes."""
        self.finished: set[int] = set()
        """The fits that reached their end trigger."""

    def groups(self) -> list[list[int]]:
        """The fits' positions, by pass: fits that can share one, in order of first appearance
        (a fit that cannot share any trains alone), split further where a pass would exceed
        the memory Spark's settings give it (:mod:`sparkdl.engine.strategies.sync.pass_memory`;
        a fit that alone exceeds a hard bound is refused here, before any job)."""
        groups: dict[tuple[Any, ...], list[int]] = {}
        footprints: dict[int, Footprint] = {}
        for k, fit in enumerate(self.specs):
            layout = ParamLayout(fit.model)
            footprints[k] = footprint(fit, layout)
            groups.setdefault(pass_key(fit, layout), []).append(k)
        ordered = sorted(groups.values(), key=lambda g: g[0])
        if len(ordered) > 1:
            log.info("%d fits train in %d passes: %s (fits of one pass share the training data "
                     "object, parameter dtype, sequence inputs, allreduce, num_blocks, device "
                     "and local rounds)", len(self.fits), len(ordered), ordered)
        planned: list[list[int]] = []
        for group in ordered:
            limits = self._budgets(self.specs[group[0]])
            passes = plan_passes(group, [footprints[k] for k in group], limits)
            self._warn_block_store(self.specs[group[0]], [footprints[k] for k in group])
            if len(passes) > 1:
                log.info("the fits %s train in %d passes, %s, to stay within %s", group,
                         len(passes), passes, ", ".join(sorted({f"{b.setting}={b.value}"
                                                                for b in limits})))
            planned.extend(passes)
        for group in planned:
            if len(group) > 1:
                log.info("pass %s holds about %s", group,
                         describe([footprints[k] for k in group]))
        return planned

    @staticmethod
    def _warn_block_store(fit: Any, fits: list[Footprint]) -> None:
        """Say before any job when these fits' weights would fill a cluster JVM's block store
        (:func:`~.strategies.sync.pass_memory.block_store_warning`)."""
        context = getattr(fit.training_rdd, "context", None)
        if context is None or not hasattr(fit.training_rdd, "getNumPartitions"):
            return
        reason = block_store_warning(lambda key: spark_setting(context, key) or None, fits)
        if reason is not None:
            log.warning("%s", reason)

    @staticmethod
    def _budgets(fit: Any) -> list[Budget]:
        """The memory bounds of a pass of fits like ``fit`` (Spark Connect: its jobs'
        functions; none in process)."""
        from ..data.dataframe_arrays import DataFrameBlocks

        data = fit.training_rdd
        if isinstance(data, DataFrameBlocks):
            return [closure_budget(fit.exchange_dir)]
        context = getattr(data, "context", None)
        if context is None or not hasattr(data, "getNumPartitions"):
            return []
        return budgets(lambda key: spark_setting(context, key) or None,
                       fit.settings.runner_options.allreduce, data.getNumPartitions())

    def run(self, keep_going: bool | None = None) -> list[torch.nn.Module]:
        """Train every fit; returns their models (the fits' own objects), in order.

        ``keep_going`` (default: True for several fits, False for one): a fit that fails leaves
        its pass and the others go on; its error is kept in :attr:`errors` and the first one
        is raised once every pass ended. Without it a failure ends the set at once."""
        keep_going = len(self.fits) > 1 if keep_going is None else keep_going
        check_shared_directories(self.specs)
        for group in self.groups():
            while group:          # fits that met a directory held by a fit of the pass: later
                self.passes.append(group)
                group = self._train_group(group, keep_going)
        if self.errors:
            first = min(self.errors)
            if len(self.fits) > 1:
                log.error("%d of %d fits failed: %s", len(self.errors), len(self.fits),
                          {k: type(e).__name__ for k, e in sorted(self.errors.items())})
            raise self.errors[first]
        return [fit.model for fit in self.specs]

    def strategy_of(self, group: list[int]) -> Strategy:
        """The strategy that trains ``group`` (fits of one pass): the set's, or local rounds
        for data-parallel fits with ``local_steps`` above 1 or an outer optimizer."""
        if self.strategy == "together" and uses_rounds(self.specs[group[0]]):
            return RoundsStrategy()
        return self.plan

    def _train_group(self, group: list[int], keep_going: bool) -> list[int]:
        """Open every fit of ``group`` on one runner and data held once, have the strategy
        drive them together (or one after another where the runner cannot run them together),
        and end each fit whatever happened. Returns the fits left for a later pass: those whose
        checkpoint directory a fit of this pass holds (one identity: the later one resumes what
        the earlier wrote)."""
        from ..runners import runner_for

        first = self.specs[group[0]]
        held = self.shared
        runner = (held.runner_for(first) if held is not None
                  else runner_for(first.training_rdd, first.exchange_dir))
        loads: dict[tuple[Any, ...], Any] = held.loads if held is not None else {}
        loaded_before = len(loads)
        strategy = self.strategy_of(group)
        if len(group) > 1 and not strategy.together(runner):
            log.info("%s runs one fit at a time: the %d fits %s train one after another",
                     type(runner).__name__, len(group), group)
            if held is None:
                runner.close()
            return [k for one in group for k in self._train_group([one], keep_going)]
        runs: dict[int, FitRun] = {}
        later: list[int] = []
        try:
            check_capability(strategy, runner)
            if strategy.name != "hop":        # data-parallel: every iteration one task a partition
                warn_waves(first.training_rdd, runner, first.settings.runner_options.device)
            for k in group:
                try:
                    runs[k] = open_fit(self.specs[k], FitView(runner, loads), strategy, k)
                except DirectoryHeldError as exc:
                    later.append(k)
                    log.info("fit %d writes to %s like a fit of this pass, with the same "
                             "identity: it trains in a later pass and resumes what that fit "
                             "wrote", k, exc.path)
                except Exception as exc:
                    if not keep_going:
                        raise
                    self.errors[k] = exc
                    log.error("fit %d failed before training: %s: %s", k, type(exc).__name__,
                              exc)
            started = [k for k in group if k in runs]
            announced = strategy.announce(started)
            if announced:
                log.info("%s", announced)
            driver = strategy.driver([runs[k] for k in started], runner, keep_going)
            try:
                driver.run()
            except BaseException as exc:
                for k in started:
                    runs[k].failure = exc
                raise
            finally:
                self.jobs += driver.jobs
                self.finished.update(started[p] for p in driver.finished)
            for position, exc in driver.errors.items():
                k = started[position]
                self.errors[k] = runs[k].failure = exc
        finally:
            self.loads += len(loads) - loaded_before
            failing = sys.exc_info()[1]
            try:
                for k, run in runs.items():
                    end_fit(self.specs[k], run)
                if held is None:
                    runner.close()
            except Exception as exc:
                if failing is None:
                    raise
                # the fit's own error says what happened (a driver whose JVM is gone cannot
                # release anything): a cleanup's error must not take its place
                log.warning("releasing the pass's broadcasts and replicas after its error "
                            "failed too: %s: %s", type(exc).__name__,
                            exception_text(exc)[:300])
        return later
