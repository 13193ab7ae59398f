"""``fitMultiple`` of the estimators: every param map's fit trained together (driver side).

The estimator's ``tuningStrategy`` says how: ``"together"`` (the default: passes, each model
bitwise the one ``fit`` gives for its map) or ``"hop"`` (model hopping,
:mod:`sparkdl.engine.strategies.hop.jobs`: each model trained whole with sequential SGD,
visiting the
partitions in the order of its map's index).

pyspark's tuners (``CrossValidator``, ``TrainValidationSplit``) call ``fitMultiple(dataset,
paramMaps)`` and read a thread-safe iterator of ``(index, model)`` from ``parallelism`` threads.
Here the first read trains every param map's fit: each is prepared as ``fit`` prepares it
(:meth:`sparkdl.ml.estimators._NNEstimatorBase._prepare_fit`), the fits that read the data the
same way share its object, and :class:`sparkdl.FitSet` trains them in passes over data held
once. Every read then returns a trained model, in index order. A param map whose fit failed
raises its error when its index is read (the others are trained and returned).

Example::

    models = dict(NNClassifier(...).fitMultiple(df, grid))     # {index: model}
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Sequence

from ..engine.fit_set import FitSet
from ..errors import InvalidArgumentError
from .mlflow_runs import tuning_stages

__all__ = ["fit_together", "FitsTogether"]

log = logging.getLogger("sparkdl")


class FitsTogether:
    """The iterator ``fitMultiple`` returns (see the module docstring)."""

    def __init__(self, stages: Sequence[Any], dataset: Any, strategy: str = "together"
                 ) -> None:
        self.stages = list(stages)
        self.dataset = dataset
        self.strategy = strategy
        self._lock = threading.Lock()
        self._trained = False
        self._next = 0
        self._models: dict[int, Any] = {}
        self._errors: dict[int, BaseException] = {}
        self.passes: list[list[int]] = []
        """The param maps' indices by pass, once trained."""
        self.loads = 0
        """The data sets held for the tasks (shards built) over all passes, once trained."""

    def __iter__(self) -> "FitsTogether":
        return self

    def __next__(self) -> tuple[int, Any]:
        with self._lock:
            if not self._trained:
                self._trained = True
                self._train()
            index = self._next
            if index >= len(self.stages):
                raise StopIteration()
            self._next += 1
        if index in self._errors:
            raise self._errors[index]
        return index, self._models[index]

    next = __next__

    def _train(self) -> None:
        cache: dict[Any, Any] = {}
        prepared = {}
        for index, stage in enumerate(self.stages):
            try:
                prepared[index] = stage._prepare_fit(self.dataset, cache)
            except Exception as exc:
                self._errors[index] = exc
        if not prepared:
            return
        order = sorted(prepared)
        # hop: each param map's model has the rotation position of its index
        fit_set = FitSet([prepared[i].engine for i in order], strategy=self.strategy,
                         hop_positions=order)
        try:
            fit_set.run(keep_going=True)
        except Exception as exc:       # the first failed fit's error, or the pass's own
            failed = {order[k]: e for k, e in fit_set.errors.items()}
            for k, index in enumerate(order):
                if index not in failed and k not in fit_set.finished:
                    failed[index] = exc
            for index, error in failed.items():
                better = prepared[index].explained(error)   # type: ignore[arg-type]
                if better is not error:
                    better.__cause__ = error
                self._errors[index] = better
        self.passes = [[order[k] for k in group] for group in fit_set.passes]
        self.loads = fit_set.loads
        for index in order:
            if index not in self._errors:
                self._models[index] = prepared[index].fitted()
        log.info("fitMultiple trained %d param maps in %d passes (%d failed)",
                 len(self.stages), len(fit_set.passes), len(self._errors))


def fit_together(estimator: Any, dataset: Any, param_maps: Sequence[Any]) -> FitsTogether:
    """``estimator.fitMultiple(dataset, param_maps)`` (see the module docstring); the
    estimator's ``tuningStrategy`` decides how the maps train (a map cannot change it)."""
    strategy = estimator.getOrDefault("tuningStrategy")
    for index, param_map in enumerate(param_maps):
        for param, value in param_map.items():
            if param.name == "tuningStrategy" and value != strategy:
                raise InvalidArgumentError(
                    f"Param map {index} sets tuningStrategy={value!r}, but the estimator's is "
                    f"{strategy!r}: the strategy decides how all the maps train together. Set it "
                    "on the estimator, not in the grid.")
    return FitsTogether(tuning_stages(estimator, param_maps), dataset, strategy)
