"""sparkdl: synchronous data-parallel PyTorch training on plain Spark.

Packages: ``engine`` (the driver's SGD loop), ``runners`` (where its jobs run: Spark RDD jobs or
in process), ``executor`` (what runs in Python workers), ``transport`` (AllReduce, frames,
codecs, the flat layout), ``data`` (inputs to arrays, the batch plan), ``ml`` (Spark ML
estimators), ``storage`` (Hadoop files, checkpoints); ``datasets`` holds demo data and models.
See docs/architecture.md.

Example::

    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxEpoch
    trained = DistriOptimizer(model=net, training_rdd=rdd, criterion=torch.nn.CrossEntropyLoss(),
                              optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                              batch_size=256, end_trigger=MaxEpoch(5)).optimize()
"""

from importlib import import_module
from typing import Any

from .errors import (CheckpointError, EmptyDataError, InvalidArgumentError,
                     ModelCriterionMismatchError, NonFiniteError, ReplicaMismatchError,
                     SparkdlError, TrainingDataError, TrainingStepError, UnidentifiableError)

_LAZY = {
    "BatchPlan": ".data.batch_plan", "DistriOptimizer": ".engine.distri_optimizer",
    "FitSet": ".engine.fit_set", "SharedRunner": ".engine.fit_set",
    "BatchedStudy": ".engine.optuna_batches",
    "OptimizerSequence": ".engine.fit.optim.optimizer_sequence",
    "SchedulerSequence": ".engine.fit.optim.optimizer_sequence",
    "TrainingSummary": ".engine.fit.reports.summary",
    "MAE": ".metrics", "Loss": ".metrics", "Top1Accuracy": ".metrics",
    "ValidationMetric": ".metrics", "NNClassifier": ".ml.estimators",
    "NNClassifierModel": ".ml.estimators", "NNEstimator": ".ml.estimators",
    "NNModel": ".ml.estimators",
}
"""The public classes, imported when first named: a Python worker that only runs sparkdl's
tasks (``sparkdl.executor``) never imports the driver's engine, pyspark.ml or pandas."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sparkdl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "DistriOptimizer",
    "FitSet",
    "SharedRunner",
    "BatchedStudy",
    "OptimizerSequence",
    "SchedulerSequence",
    "BatchPlan",
    "NNEstimator",
    "NNModel",
    "NNClassifier",
    "NNClassifierModel",
    "TrainingSummary",
    "Top1Accuracy",
    "Loss",
    "MAE",
    "ValidationMetric",
    "SparkdlError",
    "InvalidArgumentError",
    "TrainingDataError",
    "EmptyDataError",
    "UnidentifiableError",
    "ModelCriterionMismatchError",
    "TrainingStepError",
    "CheckpointError",
    "NonFiniteError",
    "ReplicaMismatchError",
]
