"""Saving and loading the DataFrame stages (MLWritable / MLReadable), Pipelines included.

An estimator saves its Params as Spark's JSON metadata plus ``objects.pkl`` (the model or
factory, criterion, preprocessing function, optimizer factory, augmentation and training and
validation steps, cloudpickled). A fitted model
saves its Params, ``weights.pt`` (a plain ``torch.save`` of the state_dict, loadable without
Spark: ``torch.load(path + "/weights.pt", weights_only=True)``), ``module.pkl`` (the
architecture), its per-epoch summary and what its fit saw of the input columns
(:mod:`sparkdl.data.input_record`, which ``transform`` checks; absent from older saves). Saving
to a path that holds anything, without ``overwrite()``, is refused before anything is written.
Loading checks that the path holds a saved stage (``metadata/``) and that the saved class is the
one asked for.

A model fitted from a :class:`~sparkdl.adapters.PretrainedModel` with a ``peft`` config saves
its adapter instead of ``weights.pt`` and the architecture: ``adapter_config.json``,
``adapter_model.safetensors`` (what ``PeftModel.save_pretrained`` writes, so
``PeftModel.from_pretrained(base, path)`` loads the saved directory itself) and
``sparkdl_base.json``, the base by reference (its path and content identity, never its
weights); ``module.pkl`` then holds only ``preprocess`` and ``collate``. Loading builds the
model from the base's path, after checking the base's identity
(:mod:`sparkdl.adapters.adapter_files`).

The metadata is written by Spark (a DataFrame write, so on the cluster's file system); the other
files through the JVM's Hadoop FileSystem on a classic session and through ``pyarrow.fs`` under
Spark Connect, where the client has no JVM (:mod:`sparkdl.storage.file_systems`): there the path
must name the same place for the client and the cluster (a local path with a local server, a
shared mount, ``s3://``, ``gs://``, ``abfs://``, ``hdfs://``). Both write the same layout, so a
stage saved under one loads under the other.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
from pyspark.ml.util import DefaultParamsReader, MLReader, MLWriter

from ..data.input_record import record_from_json
from ..errors import InvalidArgumentError
from ..spark_compat import load_metadata, save_metadata
from ..storage.file_systems import files_for_session, is_connect_session

__all__ = ["NNStageWriter", "NNStageReader", "NNModelWriter", "NNModelReader"]


_RENAMED_MODULES = {"sparkdl.estimator": "sparkdl.ml.estimators"}
"""Where stages saved by earlier versions of sparkdl live now (sparkdl 0.1 kept the estimators
in ``sparkdl.estimator``; ``sparkdl/estimator.py`` still answers that name for Pipelines)."""


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__name__}"


def _current_name(qualname: str) -> str:
    module, _, name = qualname.rpartition(".")
    return f"{_RENAMED_MODULES.get(module, module)}.{name}"


def _load_metadata(path: str, spark: Any, cls: type) -> dict[str, Any]:
    names = files_for_session(spark).names(path)
    if "metadata" not in names:
        if not names:
            raise InvalidArgumentError(f"Cannot load a {cls.__name__} from {path!r}: the path "
                                       "does not exist or is empty.")
        shown = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
        raise InvalidArgumentError(f"{path!r} is not a saved sparkdl stage (no metadata/): it "
                                   f"holds {shown}. Load the directory a stage's "
                                   "write().save(path) wrote.")
    metadata = load_metadata(path, spark)
    if _current_name(metadata["class"]) != _qualname(cls):
        raise InvalidArgumentError(f"{path} holds a {metadata['class']}, not a "
                                   f"{_qualname(cls)}; load it with that class.")
    return metadata


class _StageWriter(MLWriter):
    """An MLWriter of one stage instance."""

    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    @property
    def files(self) -> Any:
        return files_for_session(self.sparkSession)

    def save(self, path: str) -> None:
        """Save the stage to ``path``; without ``overwrite()`` a path that holds anything is
        refused before anything is written (what is there stays intact)."""
        if not self.shouldOverwrite and self.files.names(path):
            raise InvalidArgumentError(
                f"Cannot save the {type(self.instance).__name__} to {path!r}: the path already "
                f"exists. To replace it, save with write().overwrite().save({path!r}).")
        super().save(path)

    def _handleOverwrite(self, path: str) -> None:
        if is_connect_session(self.sparkSession):   # Spark's own way goes through py4j
            self.files.delete_tree(path)
        else:
            super()._handleOverwrite(path)


class _StageReader(MLReader):
    """An MLReader that builds instances of one class."""

    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    @property
    def files(self) -> Any:
        return files_for_session(self.sparkSession)


class NNStageWriter(_StageWriter):
    """Writes an unfitted estimator."""

    def saveImpl(self, path: str) -> None:
        from pyspark import cloudpickle

        # the lrScheduler and outerOptimizer Params may hold functions: they travel in
        # objects.pkl, not in the JSON
        json_params = {p.name: v for p, v in self.instance._paramMap.items()
                       if p.name not in ("lrScheduler", "outerOptimizer")}
        save_metadata(self.instance, path, self.sparkSession,
                      paramMap=json_params)
        objects = {"model": self.instance.model_spec, "criterion": self.instance.criterion,
                   "preprocess": self.instance.preprocess,
                   "optimizer_factory": self.instance.optimizer_factory,
                   "augment": self.instance.augment,
                   "lr_scheduler": self.instance.lr_scheduler,
                   "outer_optimizer": self.instance.getOuterOptimizer(),
                   "initial_weights": self.instance.initial_weights,
                   "collate": self.instance.collate,
                   "training_step": self.instance.training_step,
                   "validation_step": self.instance.validation_step}
        self.files.write(path, "objects.pkl", cloudpickle.dumps(objects))


class NNStageReader(_StageReader):
    """Reads an estimator written by :class:`NNStageWriter`."""

    def load(self, path: str) -> Any:
        metadata = _load_metadata(path, self.sparkSession, self.cls)
        instance = self.cls()
        DefaultParamsReader.getAndSetParams(instance, metadata)
        instance._resetUid(metadata["uid"])
        objects = pickle.loads(self.files.read(path, "objects.pkl"))
        instance._set_objects(objects["model"], objects["criterion"], objects["preprocess"],
                              objects["optimizer_factory"], objects.get("augment"),
                              objects.get("lr_scheduler"), objects.get("initial_weights"),
                              objects.get("collate"), objects.get("training_step"),
                              objects.get("validation_step"))
        if objects.get("outer_optimizer") is not None:
            instance._set(outerOptimizer=objects["outer_optimizer"])
        return instance


class NNModelWriter(_StageWriter):
    """Writes a fitted model: metadata, weights.pt, module.pkl."""

    def saveImpl(self, path: str) -> None:
        from pyspark import cloudpickle

        frame = self.instance.summary_frame
        record = getattr(self.instance, "input_record", None)
        extra = {"output_size": int(getattr(self.instance, "output_size", 0) or 0),
                 "summary": frame.to_dict(orient="records") if frame is not None else [],
                 "inputs": [r.to_json() for r in record] if record else None}
        adapter = _adapter_files(self.instance.module)
        if adapter is not None:
            extra["pretrained_adapter"] = True
        save_metadata(self.instance, path, self.sparkSession,
                      extraMetadata=extra)
        if adapter is not None:      # the adapter and the base's reference, not the base
            for name, data in adapter.items():
                self.files.write(path, name, data)
            self.files.write(path, "module.pkl", cloudpickle.dumps(
                {"module": None, "preprocess": self.instance.preprocess,
                 "collate": self.instance.collate}))
            return
        buf = io.BytesIO()
        torch.save(self.instance.module.state_dict(), buf)
        self.files.write(path, "weights.pt", buf.getvalue())
        self.files.write(path, "module.pkl", cloudpickle.dumps(
            {"module": self.instance.module, "preprocess": self.instance.preprocess,
             "collate": self.instance.collate}))


def _adapter_files(module: Any) -> dict[str, bytes] | None:
    """The adapter files of a pretrained fit's model with a peft config, else None."""
    from ..adapters.adapter_files import adapter_files
    from ..adapters.pretrained import pretrained_origin

    origin = pretrained_origin(module)
    if origin is None or origin[0].peft_config is None:
        return None
    return adapter_files(module)


class NNModelReader(_StageReader):
    """Reads a model written by :class:`NNModelWriter`.

    By default the architecture comes from ``module.pkl``, which is unpickled: like any pickle it
    can run code, so only load models you trust. With ``model`` (a zero-argument factory that
    builds the same architecture) nothing is unpickled: only ``weights.pt`` (loaded with
    ``weights_only=True``) and the JSON metadata are read; ``preprocess`` and ``collate`` are
    then whatever is passed here.
    """

    def __init__(self, cls: type, model: Any = None, preprocess: Any = None,
                 collate: Any = None) -> None:
        super().__init__(cls)
        self.model_factory = model
        self.preprocess = preprocess
        self.collate = collate

    def _architecture(self, path: str) -> tuple[Any, Any, Any]:
        if self.model_factory is None:
            objects = pickle.loads(self.files.read(path, "module.pkl"))
            return objects["module"], objects["preprocess"], objects.get("collate")
        module = self.model_factory()
        if not isinstance(module, torch.nn.Module):
            raise InvalidArgumentError(f"The 'model' factory passed to {self.cls.__name__}.load "
                                       f"must return a torch.nn.Module. Got "
                                       f"{type(module).__name__}.")
        return module, self.preprocess, self.collate

    def _adapter_model(self, path: str) -> tuple[Any, Any, Any]:
        from ..adapters.adapter_files import ADAPTER_FILES, REFERENCE_FILE, \
            model_from_adapter_files

        files = {n: self.files.read(path, n) for n in (*ADAPTER_FILES, REFERENCE_FILE)}
        module = model_from_adapter_files(files)
        if self.model_factory is not None:
            return module, self.preprocess, self.collate
        objects = pickle.loads(self.files.read(path, "module.pkl"))
        return module, objects["preprocess"], objects.get("collate")

    def load(self, path: str) -> Any:
        import pandas as pd

        metadata = _load_metadata(path, self.sparkSession, self.cls)
        if metadata.get("pretrained_adapter"):
            module, preprocess, collate = self._adapter_model(path)
        else:
            module, preprocess, collate = self._architecture(path)
            state = torch.load(io.BytesIO(self.files.read(path, "weights.pt")),
                               weights_only=True)
            module.load_state_dict(state)
        instance = self.cls(module, preprocess, collate)
        DefaultParamsReader.getAndSetParams(instance, metadata)
        instance._resetUid(metadata["uid"])
        instance.output_size = metadata.get("output_size", 0)
        instance.input_record = record_from_json(metadata.get("inputs"))   # None: saved before
        # records (transform then checks nothing against the fit)
        instance.summary_frame = pd.DataFrame(metadata.get("summary", []))
        return instance
