"""Fitted models in MLflow (driver side; needs ``pip install 'sparkdl-torch[mlflow]'``).

Three ways, for three uses:

- The Spark stage, in a ``PipelineModel``: ``mlflow.spark.log_model(pipeline_model, name=...)``
  and ``mlflow.spark.load_model(uri)`` work as they are: they save and load through the stages'
  ``MLWritable`` / ``MLReadable`` (:mod:`sparkdl.ml.persistence`), and Spark finds sparkdl's
  Python stages by the class name in their metadata. Loading needs sparkdl importable where it
  loads (and unpickles the model's ``module.pkl``: load only models you trust).
- The torch module alone, for serving without Spark: :func:`log_pytorch_model` calls
  ``mlflow.pytorch.log_model`` with an input example and a signature taken from the training
  rows (what the module receives, after ``featureShape`` and ``preprocess``), and records the
  training columns in the MLflow model's metadata.
- The adapter of a LoRA (``peft``) fit of a :class:`~sparkdl.adapters.PretrainedModel`:
  :func:`log_adapter` logs its files as artifacts (``adapter_config.json``,
  ``adapter_model.safetensors``, and ``sparkdl_base.json``, the base by path and content
  identity, never its weights): ``PeftModel.from_pretrained(base, downloaded_dir)`` and
  :func:`sparkdl.adapters.load_adapter` read them back.

Example::

    model = NNClassifier(..., featuresCol="features").fit(train_df)
    with mlflow.start_run():
        info = log_pytorch_model(model)                 # + input example and signature
    mlflow.pyfunc.load_model(info.model_uri).predict(x)  # x: float32 array [n, 4]
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from ..engine.fit.reports.mlflow_tracking import check_mlflow
from ..errors import InvalidArgumentError
from ..executor.step import as_model_input
from ..metrics import prediction_tensor

__all__ = ["training_example", "log_pytorch_model", "log_adapter", "EXAMPLE_ROWS"]

log = logging.getLogger("sparkdl")

EXAMPLE_ROWS = 5
"""Training rows kept on a fitted model as its input example."""


def training_example(engine: Any, rows: int = EXAMPLE_ROWS) -> list[np.ndarray] | None:
    """The first ``rows`` training rows of a finished :class:`~sparkdl.DistriOptimizer` run as
    the module's arguments (one array per argument), or None before any data was loaded."""
    if engine.data_spec is None:
        return None
    args = engine.fit.model_arguments(list(engine.data_spec.sample_features))
    return [as_model_input(a, None).detach().cpu().numpy()[:rows].copy() for a in args]


def _input_columns(model: Any) -> list[str]:
    get = model.getOrDefault
    return list(get("inputCols")) or list(get("featuresCols")) or [get("featuresCol")]


def _signature(example: np.ndarray, output: np.ndarray) -> Any:
    """One tensor in, one out, any number of rows (built here: MLflow's own inference needs
    scipy, which ``mlflow-skinny`` does not bring)."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    def spec(a: np.ndarray) -> Any:
        return Schema([TensorSpec(a.dtype, (-1, *a.shape[1:]))])

    return ModelSignature(inputs=spec(example), outputs=spec(output))


def log_pytorch_model(model: Any, name: str = "model",
                      input_example: np.ndarray | None = None, **log_model_args: Any) -> Any:
    """Log the torch module of a fitted :class:`~sparkdl.NNModel` or
    :class:`~sparkdl.NNClassifierModel` with ``mlflow.pytorch.log_model`` (to the active run,
    or the one MLflow starts) and return its ``ModelInfo``.

    The input example is ``input_example`` or the training rows the model kept from its fit
    (:attr:`training_example`; a model loaded from disk has none: pass one); the signature is
    inferred from that example and the module's output on it. MLflow's pytorch flavor serves
    single-tensor models only: a module with several inputs is logged without example and
    signature. The training columns go into the MLflow model's metadata
    (``sparkdl_input_columns``). ``log_model_args`` go to ``mlflow.pytorch.log_model``
    (``pip_requirements``, ``registered_model_name``, ``signature``, ...).

    Example::

        with mlflow.start_run():
            info = log_pytorch_model(model, registered_model_name="churn")
    """
    mlflow = check_mlflow("log_pytorch_model")
    import mlflow.pytorch

    module = getattr(model, "module", None)
    if not isinstance(module, torch.nn.Module):
        raise InvalidArgumentError("log_pytorch_model needs a fitted NNModel or "
                                   f"NNClassifierModel. Got {type(model).__name__}.")
    if input_example is not None:
        examples: list[np.ndarray] | None = [np.asarray(input_example)]
    else:
        examples = getattr(model, "training_example", None)
    if examples is None:
        raise InvalidArgumentError(
            "This model keeps no training rows (it was loaded, not fitted here): pass "
            "input_example=<array of a few rows, as the module takes them>.")
    metadata = dict(log_model_args.pop("metadata", None) or {})
    metadata.setdefault("sparkdl_input_columns", _input_columns(model))
    if len(examples) == 1:
        example = examples[0]
        if "signature" not in log_model_args:
            was_training = module.training
            module.eval()
            with torch.no_grad():
                output = module(torch.from_numpy(np.ascontiguousarray(example)))
            module.train(was_training)
            output = prediction_tensor(output)
            log_model_args["signature"] = _signature(example, output.float().numpy())
        log_model_args.setdefault("input_example", example)
    else:
        log.info("log_pytorch_model: the module takes %d inputs; MLflow's pytorch flavor serves "
                 "one tensor, so it is logged without input example and signature",
                 len(examples))
    where = {"name": name} if int(mlflow.__version__.split(".")[0]) >= 3 else \
        {"artifact_path": name}
    return mlflow.pytorch.log_model(module, metadata=metadata, **where, **log_model_args)


def log_adapter(model: Any, name: str = "adapter") -> str:
    """Log the adapter of a fitted LoRA (``peft``) model as artifacts under ``name`` of the
    active run (or the one MLflow starts) and return their artifact URI. ``model``: a fitted
    :class:`~sparkdl.NNModel` / :class:`~sparkdl.NNClassifierModel` of a
    :class:`~sparkdl.adapters.PretrainedModel`, or the peft model ``optimize()`` returned.
    The files are :func:`sparkdl.adapters.adapter_files.adapter_files`'s: the adapter in
    peft's format and the base's reference (a few MB for LoRA, whatever the base's size).

    Example::

        with mlflow.start_run():
            uri = log_adapter(fitted)
        local = mlflow.artifacts.download_artifacts(uri)
        PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), local)
    """
    import os
    import tempfile

    mlflow = check_mlflow("log_adapter")
    from ..adapters.adapter_files import save_adapter

    module = getattr(model, "module", model)
    with tempfile.TemporaryDirectory() as scratch:
        save_adapter(module, os.path.join(scratch, name))
        mlflow.log_artifacts(os.path.join(scratch, name), artifact_path=name)
    return f"{mlflow.get_artifact_uri()}/{name}"
