"""Which MLflow run an estimator's ``fit`` logs to, and its parameters (driver side).

With ``mlflowLogging=True`` a fit logs through the engine
(:meth:`sparkdl.DistriOptimizer.set_mlflow`, :mod:`sparkdl.engine.fit.reports.mlflow_tracking`): the
estimator's Params (plus the model's and the criterion's class) as the run's parameters, the
per-iteration loss, throughput and learning rate, the validation metrics and the summary
artifact. The run:

- a plain ``fit``: the MLflow run active in the calling thread, else a new run named after the
  estimator, ended when ``fit`` returns;
- fits through ``fitMultiple`` (``CrossValidator``, ``TrainValidationSplit``,
  ``est.fit(df, [map1, map2])``): each fit gets its own child run (named
  ``"<Estimator> fit <i>"``, tagged with its param map) of the run active where ``fitMultiple``
  was called, or a new top-level run when none was, so parallel fits never share a run. MLflow
  keeps the active run per thread and the tuners fit on pool threads: the parent is taken when
  ``fitMultiple`` is called, on the caller's thread, and passed by run id.
- A ``Pipeline`` inside a tuner fits the estimator through the Pipeline's own ``fitMultiple``, on
  a pool thread that no run is active in: each of those fits gets a new top-level run.

Example::

    with mlflow.start_run():
        CrossValidator(estimator=NNClassifier(..., mlflowLogging=True), ...,
                       parallelism=2, seed=7).fit(df)     # one child run per fit
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from ..engine.fit.reports.mlflow_tracking import active_run_id, check_mlflow

__all__ = ["check_logging", "tuning_stages", "configure_mlflow", "stage_params"]

_PARENT = "_sparkdl_mlflow_parent"
_INDEX = "_sparkdl_mlflow_fit_index"
_MAP = "_sparkdl_mlflow_param_map"


def check_logging(stage: Any) -> None:
    """With ``mlflowLogging=True``: an error now, before any cluster work, when MLflow is not
    installed."""
    if stage.getOrDefault("mlflowLogging"):
        check_mlflow(f"{type(stage).__name__} (mlflowLogging=True)")


def tuning_stages(estimator: Any, param_maps: Sequence[Any]) -> list[Any]:
    """One copy of ``estimator`` per param map for ``fitMultiple``, each remembering the run
    active now, its index and its map, so that every fit, on any thread, logs to a child run of
    that run."""
    base = estimator.copy()
    setattr(base, _PARENT, active_run_id())
    stages = []
    for index, param_map in enumerate(param_maps):
        stage = base.copy(param_map)
        setattr(stage, _INDEX, index)
        setattr(stage, _MAP, {p.name: v for p, v in param_map.items()})
        stages.append(stage)
    return stages


def stage_params(stage: Any, engine: Any) -> dict[str, Any]:
    """Every Param of ``stage`` (set or default) plus the classes of the model and criterion
    and, when given, the optimizer factory's name."""
    params: dict[str, Any] = {p.name: getattr(v, "__qualname__", type(v).__name__)
                              if callable(v) else v
                              for p, v in stage.extractParamMap().items()}
    params["model"] = type(engine.model).__name__
    params["criterion"] = (type(engine.criterion).__name__ if engine.criterion is not None
                           else None)
    for name, function in (("optimizerFactory", getattr(stage, "optimizer_factory", None)),
                           ("trainingStep", getattr(stage, "training_step", None))):
        if function is not None:
            params[name] = getattr(function, "__qualname__", type(function).__name__)
    return params


def configure_mlflow(stage: Any, engine: Any) -> None:
    """``engine.set_mlflow(...)`` for ``stage``'s fit when ``mlflowLogging`` is on."""
    if not stage.getOrDefault("mlflowLogging"):
        return
    name = type(stage).__name__
    tags = {"sparkdl.estimator": name, "sparkdl.estimator_uid": stage.uid}
    index = getattr(stage, _INDEX, None)
    if index is None:
        engine.set_mlflow(run_name=name, params=stage_params(stage, engine), tags=tags)
        return
    tags["sparkdl.fit_index"] = str(index)
    tags["sparkdl.param_map"] = json.dumps(getattr(stage, _MAP, {}), default=repr)
    engine.set_mlflow(run_id=None, parent_run_id=getattr(stage, _PARENT, None),
                      run_name=f"{name} fit {index}", params=stage_params(stage, engine),
                      tags=tags)
