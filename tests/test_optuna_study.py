"""Issue 36, acceptance 6: an Optuna study's trials asked in batches and trained together
(sparkdl.engine.optuna_batches.BatchedStudy): each trial's reported values are those of its own
fit trained alone, the median pruner prunes the same trials, pruned fits leave the pass, and the
data is held once for the whole study."""

from __future__ import annotations

import optuna   # the optuna extra (installed with the test extras): missing fails, never skips
import pytest
import torch
from torch import nn

from models import SmallNet, classification_data, make_rdd
from sparkdl import DistriOptimizer
from sparkdl.engine.optuna_batches import BatchedStudy
from sparkdl.metrics import Loss
from sparkdl.triggers import EveryEpoch, MaxEpoch

EPOCHS = 3


@pytest.fixture(scope="module")
def data(sc):
    x, y = classification_data(96, seed=11)
    train = make_rdd(sc, list(zip(x[:64], y[:64])), [24, 40])
    val = make_rdd(sc, list(zip(x[64:], y[64:])), [16, 16])
    return train, val


def study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        direction="minimize", sampler=optuna.samplers.RandomSampler(seed=3),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1))


def fit_maker(data):
    train, val = data

    def make_fit(trial: optuna.Trial) -> DistriOptimizer:
        torch.manual_seed(0)
        net = SmallNet()
        lr = trial.suggest_float("lr", 1e-3, 1.0, log=True)
        momentum = trial.suggest_float("momentum", 0.0, 0.9)
        batch = trial.suggest_categorical("batch", [16, 32])
        opt = DistriOptimizer(net, train, nn.CrossEntropyLoss(),
                              torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum),
                              batch_size=batch, end_trigger=MaxEpoch(EPOCHS), seed=trial.number,
                              progress_bar=False)
        return opt.set_validation(val, EveryEpoch(), [Loss()])

    return make_fit


def test_a_batched_study_equals_the_same_study_with_every_trial_fit_alone(data):
    together = BatchedStudy(study(), fit_maker(data), "Loss", batch_size=4)
    batched = together.optimize(8)
    alone = BatchedStudy(study(), fit_maker(data), "Loss", batch_size=4, together=False)
    single = alone.optimize(8)
    assert together.batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
    for a, b in zip(batched, single):
        assert a.params == b.params
        assert a.intermediate_values == b.intermediate_values       # bitwise equal floats
        assert a.state == b.state and a.value == b.value
    states = [t.state for t in batched]
    pruned = [t for t in batched if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned and optuna.trial.TrialState.COMPLETE in states, states
    # a pruned trial left the pass: it reported fewer epochs than the others
    assert all(len(t.intermediate_values) < EPOCHS for t in pruned)
    assert all(len(t.intermediate_values) == EPOCHS for t in batched
               if t.state == optuna.trial.TrialState.COMPLETE)
    # a finished trial's value: its last validation's
    assert all(t.value == t.intermediate_values[EPOCHS] for t in batched
               if t.state == optuna.trial.TrialState.COMPLETE)
    # the training and validation data held once for the whole study, in both ways
    assert together.loads == alone.loads == 2
    # one job per iteration for a batch: the batch's longest fit's, not the sum of its fits'
    assert together.jobs < alone.jobs / 2, (together.jobs, alone.jobs)


def test_make_fit_errors_fail_their_trial_and_the_study_goes_on(data):
    make = fit_maker(data)

    def flaky(trial):
        if trial.number == 1:
            raise ValueError("no model for this trial")
        return make(trial)

    s = study()
    trials = BatchedStudy(s, flaky, "Loss", batch_size=3).optimize(3)
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE,
                                         optuna.trial.TrialState.FAIL,
                                         optuna.trial.TrialState.COMPLETE]


def test_a_hop_study_prunes_at_epoch_ends_and_reports_as_each_trial_alone(data):
    """strategy='hop': each trial's reported values equal those of the same trial hopping
    alone in its order (its place in the batch); pruned trials leave at an epoch's end."""
    together = BatchedStudy(study(), fit_maker(data), "Loss", batch_size=4, strategy="hop")
    batched = together.optimize(8)
    alone = BatchedStudy(study(), fit_maker(data), "Loss", batch_size=4, together=False,
                         strategy="hop")
    single = alone.optimize(8)
    for a, b in zip(batched, single):
        assert a.params == b.params
        assert a.intermediate_values == b.intermediate_values       # bitwise equal floats
        assert a.state == b.state and a.value == b.value
    pruned = [t for t in batched if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned and optuna.trial.TrialState.COMPLETE in [t.state for t in batched]
    for t in pruned:       # reported once per finished epoch, then left
        assert sorted(t.intermediate_values) == list(range(1, len(t.intermediate_values) + 1))
        assert len(t.intermediate_values) < EPOCHS
    # the hop's values are not the pass's: each model trained by sequential SGD
    passed = BatchedStudy(study(), fit_maker(data), "Loss", batch_size=4).optimize(4)
    assert [t.intermediate_values for t in passed] != [t.intermediate_values
                                                        for t in batched[:4]]
    # one job per sub-epoch for the batch: 2 partitions x 3 epochs at most, plus validations
    assert together.jobs <= 2 * (2 * EPOCHS), together.jobs


def test_an_error_of_the_whole_batch_fails_its_trials_and_the_study_goes_on(data,
                                                                           monkeypatch):
    """A job that fails for every fit (here: raised on the batch's fifth job, after some
    trials reported) ends the batch: its trials are FAIL, never COMPLETE with a partial value,
    and the next batch trains."""
    from sparkdl.engine.strategies.sync.pass_jobs import PassJobs as PassLoop

    real, calls = PassLoop.iteration, []

    def failing(self, active):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("the cluster went away")
        return real(self, active)

    monkeypatch.setattr(PassLoop, "iteration", failing)
    batched = BatchedStudy(study(), fit_maker(data), "Loss", batch_size=4).optimize(8)
    first, second = batched[:4], batched[4:]
    assert any(t.intermediate_values for t in first)      # some had reported before the error
    assert all(t.state == optuna.trial.TrialState.FAIL for t in first), \
        [t.state for t in first]
    assert all(t.state != optuna.trial.TrialState.FAIL for t in second), \
        [t.state for t in second]
