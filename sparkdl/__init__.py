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

from .errors import (CheckpointError, EmptyDataError, InvalidArgumentError,
                     ModelCriterionMismatchError, NonFiniteError, ReplicaMismatchError,
                     SparkdlError, TrainingDataError, TrainingStepError, UnidentifiableError)
from .data.batch_plan import BatchPlan
from .engine.distri_optimizer import DistriOptimizer
from .engine.fit_set import FitSet, SharedRunner
from .engine.optuna_batches import BatchedStudy
from .engine.optimizer_sequence import OptimizerSequence, SchedulerSequence
from .engine.summary import TrainingSummary
from .metrics import MAE, Loss, Top1Accuracy, ValidationMetric
from .ml.estimators import NNClassifier, NNClassifierModel, NNEstimator, NNModel

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
