"""Optuna studies whose trials train together (driver side; the optional extra
``sparkdl-torch[optuna]``).

:class:`BatchedStudy` asks a study for its trials in batches of ``batch_size`` and trains each
batch as one :class:`sparkdl.FitSet` (one Spark job per iteration for the whole batch), over
data held once for the whole study (:class:`sparkdl.engine.fit_set.SharedRunner`):

* each trial's fit comes from your ``make_fit(trial)``: a :class:`sparkdl.DistriOptimizer` whose
  validation computes ``metric`` (``set_validation(data, EveryEpoch(), [...])``);
* after each validation the fit reports ``metric`` to its trial (the step: epochs finished) and
  asks the study's pruner; a pruned trial's fit leaves the pass at once, the others go on;
* when the batch ends, each trial is told its last reported value, or that it was pruned, or
  that it failed (its error logged); then the next batch is asked, knowing every earlier one.

A trial's reported values are those of its own fit trained alone: the pass changes cost, never
results. Which trials are pruned can depend on when the others report: the median and
percentile pruners compare only finished trials, which are the same whether a batch trains
together or one trial after another (``together=False``), so they prune the same trials; the
successive-halving and Hyperband pruners also compare the batch's running trials, which report
in another order when trained one after another.

Example::

    import optuna

    def make_fit(trial):
        net = make_net()
        opt = DistriOptimizer(net, train_rdd, nn.CrossEntropyLoss(),
                              torch.optim.SGD(net.parameters(),
                                              lr=trial.suggest_float("lr", 1e-3, 0.3, log=True)),
                              batch_size=64, end_trigger=MaxEpoch(8), seed=0)
        return opt.set_validation(val_rdd, EveryEpoch(), [Top1Accuracy()])

    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner())
    BatchedStudy(study, make_fit, "Top1Accuracy", batch_size=8).optimize(32)
    study.best_params
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..argument_checks import check_choice
from ..errors import InvalidArgumentError
from ..triggers import TrainingState, Trigger
from .fit.spec import fit_of
from .fit_set import STRATEGIES, FitSet, SharedRunner

__all__ = ["BatchedStudy", "ReportToTrial"]

log = logging.getLogger("sparkdl")


def _optuna() -> Any:
    try:
        import optuna
    except ImportError as exc:      # the extra is optional: say how to get it
        raise ImportError("BatchedStudy needs Optuna: pip install 'sparkdl-torch[optuna]'") from exc
    return optuna


class ReportToTrial(Trigger):
    """A part of a fit's end trigger: after each validation, reports ``metric`` to ``trial``
    (step: the epochs finished) and fires when the study's pruner prunes the trial.
    ``values``: what it reported, by step; ``pruned``: whether it fired."""

    def __init__(self, trial: Any, metric: str) -> None:
        self._trial = trial
        self.metric = metric
        self.values: dict[int, float] = {}
        self.pruned = False

    def __call__(self, state: TrainingState) -> bool:
        if not state.validated:
            return False
        value = float(state.metrics[self.metric])
        self.values[state.epoch] = value
        self._trial.report(value, state.epoch)
        self.pruned = bool(self._trial.should_prune())
        return self.pruned

    def metric_names(self) -> set[str]:
        return {self.metric}

    def catch_up(self, summary: Any) -> None:
        """Report the validations of a history the fit resumed rather than ran (a checkpoint
        of the same fit: a trial that repeats an earlier one's settings resumes its end), in
        order, for the steps not reported yet."""
        if summary is None:
            return
        for record in summary.validations:
            if record.epoch not in self.values and self.metric in record.metrics:
                value = float(record.metrics[self.metric])
                self.values[record.epoch] = value
                self._trial.report(value, record.epoch)


class BatchedStudy:
    """Run an Optuna ``study`` in batches of trials trained together (see the module docstring).

    Args:
        study: an ``optuna.Study`` (its sampler and pruner decide; seed the sampler for a
            repeatable study).
        make_fit: ``trial -> DistriOptimizer``, its validation computing ``metric``. Every fit
            must train on the same training data object (it is held once for the study).
        metric: the validation metric reported to the trials and told as their value (the last
            one reported).
        batch_size: trials asked and trained together at a time.
        together: False trains each batch's trials one after another (the same trials, values
            and, with the median pruner, the same pruning: a way to check, or to bound memory).
        strategy: how a batch trains: ``"together"`` (a pass: each trial's fit exactly its
            data-parallel fit) or ``"hop"`` (model hopping,
            :mod:`sparkdl.engine.strategies.hop.jobs`:
            each trial's model trained whole, partition after partition, in the order of its
            place in the batch; it reports and can be pruned at epoch ends).

    Example::

        BatchedStudy(study, make_fit, "Loss", batch_size=8).optimize(32)
    """

    def __init__(self, study: Any, make_fit: Callable[[Any], Any], metric: str,
                 batch_size: int = 8, together: bool = True, strategy: str = "together"
                 ) -> None:
        _optuna()
        self.strategy = check_choice("strategy", "BatchedStudy", strategy, STRATEGIES)
        if not callable(make_fit):
            raise InvalidArgumentError("BatchedStudy's make_fit must be a function of a trial "
                                       f"returning a DistriOptimizer; got {make_fit!r}.")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"BatchedStudy's batch_size must be a positive int; got "
                                       f"{batch_size!r}.")
        self.study, self.make_fit, self.metric = study, make_fit, metric
        self.batch_size, self.together = batch_size, together
        self.batches: list[list[int]] = []
        """The trials' numbers, by batch."""
        self.loads = 0
        """The data sets held for the tasks over the whole study (shards built)."""
        self.jobs = 0
        """The gradient jobs of every batch."""

    def optimize(self, n_trials: int) -> list[Any]:
        """Ask, train and tell ``n_trials`` trials; returns them (``optuna.trial.FrozenTrial``),
        in the order asked."""
        if not isinstance(n_trials, int) or n_trials < 1:
            raise InvalidArgumentError(f"optimize's n_trials must be a positive int; got "
                                       f"{n_trials!r}.")
        numbers: list[int] = []
        with SharedRunner() as shared:
            while len(numbers) < n_trials:
                trials = [self.study.ask()
                          for _ in range(min(self.batch_size, n_trials - len(numbers)))]
                self.batches.append([t.number for t in trials])
                self._train_and_tell(trials, shared)
                numbers.extend(t.number for t in trials)
        by_number = {t.number: t for t in self.study.get_trials(deepcopy=False)}
        return [by_number[n] for n in numbers]

    def _train_and_tell(self, trials: list[Any], shared: SharedRunner) -> None:
        state = _optuna().trial.TrialState
        fits: dict[int, Any] = {}
        reports: dict[int, ReportToTrial] = {}
        errors: dict[int, BaseException] = {}
        for k, trial in enumerate(trials):
            try:
                fit = self.make_fit(trial)
                if fit_of(fit) is None:
                    raise InvalidArgumentError(f"make_fit must return a DistriOptimizer; got "
                                               f"{type(fit).__name__} for trial {trial.number}.")
                reports[k] = ReportToTrial(trial, self.metric)
                fit.end_trigger = fit.end_trigger | reports[k]
                fits[k] = fit
            except Exception as exc:        # noqa: BLE001 - the trial fails, the study goes on
                errors[k] = exc
        order = sorted(fits)
        positions = ([order] if order else []) if self.together else [[k] for k in order]
        for members in positions:       # hop: a trial's rotation position is its place
            fit_set = FitSet([fits[k] for k in members], shared=shared,   # in the batch
                             strategy=self.strategy, hop_positions=members)
            try:
                fit_set.run(keep_going=True)
            except Exception as exc:        # noqa: BLE001 - the trials fail, the study goes on
                # a fit's own error is in fit_set.errors; an error of the whole set (a task
                # past Spark's retries, data lost too often) ends every fit still training
                for position in range(len(members)):
                    if position not in fit_set.errors and position not in fit_set.finished:
                        errors[members[position]] = exc
            self.loads += fit_set.loads
            self.jobs += fit_set.jobs
            for position, exc in fit_set.errors.items():
                errors[members[position]] = exc
        pruned = []
        for k, trial in enumerate(trials):
            report = reports.get(k)
            if report is not None and k not in errors:
                report.catch_up(getattr(fits[k], "summary", None))
            if k in errors:
                log.warning("trial %d failed: %s: %s", trial.number, type(errors[k]).__name__,
                            errors[k])
                self.study.tell(trial, state=state.FAIL)
            elif report.pruned:
                pruned.append(trial.number)
                self.study.tell(trial, state=state.PRUNED)
            elif not report.values:
                log.warning("trial %d reported no %s (its fit validated never): told as failed",
                            trial.number, self.metric)
                self.study.tell(trial, state=state.FAIL)
            else:
                self.study.tell(trial, report.values[max(report.values)])
        log.info("trials %s trained %s: %d pruned %s, %d failed", [t.number for t in trials],
                 "together" if self.together else "one after another", len(pruned), pruned,
                 len(errors))
