"""sparkdl: synchronous data-parallel PyTorch training on plain Spark.

Example::

    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxEpoch
    trained = DistriOptimizer(model=net, training_rdd=rdd, criterion=torch.nn.CrossEntropyLoss(),
                              optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                              batch_size=256, end_trigger=MaxEpoch(5)).optimize()
"""

from .errors import (CheckpointError, InvalidArgumentError, ModelCriterionMismatchError,
                     NonFiniteError, SparkdlError, TrainingDataError)
from .estimator import NNClassifier, NNClassifierModel, NNEstimator, NNModel
from .metrics import MAE, Loss, Top1Accuracy, ValidationMetric
from .optimizer import DistriOptimizer
from .summary import TrainingSummary

__version__ = "0.1.0"

__all__ = [
    "DistriOptimizer",
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
    "ModelCriterionMismatchError",
    "CheckpointError",
    "NonFiniteError",
]
