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

import os
from importlib import import_module
from typing import Any

__version__ = "0.1.0"
"""The one version source: setuptools reads it for the distribution's metadata."""
__distribution__ = "sparkdl-torch"
"""The distribution (pip) name that installs this package; the import name is ``sparkdl``."""

_FOREIGN_PROJECTS = {
    **dict.fromkeys(("horovod", "xgboost"), "Databricks' runtime module sparkdl (HorovodRunner, "
                    "XGBoost)"),
    **dict.fromkeys(("graph", "image", "transformers", "estimators", "udf", "param", "utils"),
                    "the 2018 PyPI project sparkdl (Deep Learning Pipelines)"),
}
"""Entries other projects named ``sparkdl`` install, and which project they belong to."""


def _refuse_a_mixed_package_directory() -> None:
    """Raise ImportError when the package directory also holds another ``sparkdl``'s files.

    Two distributions that both install a ``sparkdl`` directory into one site-packages leave
    one directory with both projects' files; neither works. Only the entries those projects
    are known to install count (:data:`_FOREIGN_PROJECTS`, none of them a name of this
    package's: tests/test_packaging.py), so a file of one's own never stops an import.
    Executors import sparkdl in every Python worker: this costs one ``os.listdir`` of a few
    dozen names (microseconds).
    """
    directory = os.path.dirname(os.path.abspath(__file__))
    try:
        names = os.listdir(directory)
    except OSError:   # not a plain directory (a zip archive): nothing can be mixed in by pip
        return
    foreign = sorted(n for n in names if n.split(".")[0] in _FOREIGN_PROJECTS
                     and not _only_bytecode(os.path.join(directory, n)))
    if not foreign:
        return
    owners = sorted({_FOREIGN_PROJECTS[n.split(".")[0]] for n in foreign})
    raise ImportError(
        f"The package directory {directory} holds sparkdl-torch's files and another project's: "
        f"{', '.join(foreign)}, which look like {' and '.join(owners)}. Two distributions were "
        "installed into one 'sparkdl' directory, which works as neither. Install sparkdl-torch "
        "into an environment without the other: pip uninstall -y sparkdl sparkdl-torch && pip "
        "install sparkdl-torch; where a runtime ships its own sparkdl, install sparkdl-torch "
        "into a notebook-scoped or virtual environment that comes ahead of the runtime's.")


def _only_bytecode(path: str) -> bool:
    """A directory holding nothing but ``__pycache__`` (or nothing): a removed package's leftover,
    not another project's files."""
    try:
        return os.path.isdir(path) and set(os.listdir(path)) <= {"__pycache__"}
    except OSError:
        return False


_refuse_a_mixed_package_directory()

from .errors import (CheckpointError, EmptyDataError, InvalidArgumentError,  # noqa: E402
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
