"""The estimators' module path in sparkdl 0.1, kept so that Pipelines and models saved then still
load (Spark's Pipeline reader imports each stage's class by the name saved with it). New code
imports from ``sparkdl`` or :mod:`sparkdl.ml.estimators`.
"""

from .ml.estimators import NNClassifier, NNClassifierModel, NNEstimator, NNModel

__all__ = ["NNEstimator", "NNModel", "NNClassifier", "NNClassifierModel"]
