"""``transform``: model outputs for a DataFrame through an Arrow iterator UDF.

The UDF's closure carries the pickled model once; each Python worker unpickles it once
(module-level cache in this importable module) and runs it on batches of ``inferenceBatchSize``
rows cut from Spark's Arrow batches.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterator, Sequence, Tuple

import numpy as np
import pyarrow as pa
import torch

from ..adapters.pretrained import shipped_model
from ..data.dataframe_arrays import FeatureSource, arrow_inputs, numpy_float_dtype
from ..data.input_record import check_widths
from ..data.ragged import Ragged, model_arguments
from ..errors import InvalidArgumentError
from ..executor.id_checks import IdOrigin, argument_names, checked_ids
from ..executor.devices import task_device
from ..executor.step import as_model_input, autocast, set_task_threads
from ..executor.worker_cache import WorkerCache
from ..executor.exchange import Exchange, Payload
from ..metrics import prediction_tensor
from ..spark_compat import arrow_iterator_udf

__all__ = ["predict_column"]

# Models unpickled in this Python worker, by the hash of their bytes (executor side).
_MODELS: WorkerCache[torch.nn.Module] = WorkerCache(capacity=4, freeze=True)


def _unpickled_for_inference(payload: bytes) -> torch.nn.Module:
    import pickle

    model = pickle.loads(payload)
    model.eval()
    return model


def _cached_model(key: str, payload: Payload, device: str) -> torch.nn.Module:
    """This worker's copy of the model on ``device`` (one per device: a reused worker may be
    given another GPU in a later task)."""
    return _MODELS.get_or_create((key, device),
                                 lambda: _unpickled_for_inference(payload.read()).to(device))


def _outputs(model: torch.nn.Module, xs: Sequence[Any], batch_size: int,
             device: torch.device, precision: str, width: int,
             padding_value: float = 0.0, collate: Any = None,
             names: Sequence[str] = ()) -> np.ndarray:
    """The model's outputs on the rows of ``xs`` (one array per input), ``width`` values per
    row (used for an empty batch, which the model is not called on); embedding ids out of
    their table's range raise :class:`~sparkdl.errors.InvalidArgumentError` naming the column
    (``names``: the inputs' columns)."""
    set_task_threads()
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    chunks = []
    rows = len(xs[0]) if xs else 0
    with torch.no_grad(), autocast(precision, device):
        for lo in range(0, rows, batch_size):
            rows_here = np.arange(lo, min(lo + batch_size, rows))
            features = [x.take(rows_here) if isinstance(x, Ragged) else x[rows_here]
                        for x in xs]   # new arrays (fancy indexing copies)
            batch = [as_model_input(a, dtype).to(device)
                     for a in model_arguments(features, padding_value, collate)]
            origin = IdOrigin(argument_names(features, names, collate), _partition(),
                              what="transform", error=InvalidArgumentError)
            with checked_ids(model, batch, origin):
                out = prediction_tensor(model(*batch))
            chunks.append(out.double().reshape(out.shape[0], -1).cpu().numpy())
    return np.concatenate(chunks) if chunks else np.zeros((0, width))


def _partition() -> int | None:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else None


def _list_array(m: np.ndarray) -> pa.Array:
    offsets = np.arange(0, m.size + 1, max(m.shape[1], 1) if m.ndim == 2 else 1, dtype=np.int32)
    if m.ndim == 2 and m.shape[1] == 0:
        offsets = np.zeros(len(m) + 1, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(m.reshape(-1)))


def predict_column(model: torch.nn.Module, sources: Sequence[FeatureSource],
                   feature_shape: Sequence[int],
                   preprocess: Callable[[np.ndarray], np.ndarray] | None, batch_size: int,
                   classifier: bool, single_output: bool, device: str = "auto",
                   precision: str = "32", width: int = 1, padding_value: float = 0.0,
                   collate: Any = None, exchange_dir: str | None = None,
                   widths: Sequence[int | None] | None = None) -> Any:
    """An Arrow UDF mapping the input columns (``input_expressions(sources)``) to the model's
    outputs (``width`` values per row).

    Classifier: ``struct<raw: array<double>, probability: array<double>, prediction: double>``;
    one output per row is a logit (probability ``sigmoid``), several are softmaxed.
    Otherwise: ``double`` when the model has one output per row, else ``array<double>``.
    With ``exchange_dir`` (Spark Connect) a model above the closure limit reaches the tasks as
    a file there (:mod:`sparkdl.executor.exchange`), not inside the UDF; the file stays for
    the lazy DataFrame's later evaluations. ``widths``: the values per row of each input the
    model was fitted on (:mod:`sparkdl.data.input_record`), checked before the model runs.
    """
    from pyspark import cloudpickle

    # a pretrained model ships as its description and trained tensors: the tasks load the base
    pickled = cloudpickle.dumps(shipped_model(model))
    key = hashlib.sha1(pickled).hexdigest()
    payload = Exchange(exchange_dir, f"model-{key}").ship(pickled, "model", unique=False)
    shape = list(feature_shape)
    sources = list(sources)
    float_dtype = numpy_float_dtype(model)
    names = [s.name for s in sources]
    widths = list(widths) if widths else None
    if classifier:
        return_type = "struct<raw: array<double>, probability: array<double>, prediction: double>"
    else:
        return_type = "double" if single_output else "array<double>"

    def predict(batches: Iterator[Tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
        target = task_device(device).device
        net = _cached_model(key, payload, target)   # payload.read(): once per worker
        for columns in batches:
            columns = columns if isinstance(columns, tuple) else (columns,)
            if widths:
                check_widths(columns, sources, widths)
            xs = arrow_inputs(columns, sources, shape, preprocess, float_dtype)
            out = _outputs(net, xs, batch_size, torch.device(target), precision, width,
                           padding_value, collate, names)
            if classifier:
                # torch, not numpy, computes the probabilities: the same torch gives the same
                # bits whatever numpy (whose exp differs in the last bit between 1.x and 2.x)
                if out.shape[1] == 1:  # one logit: binary classification
                    p1 = torch.sigmoid(torch.from_numpy(out[:, 0])).numpy()
                    prob = np.stack([1 - p1, p1], axis=1)
                    raw = np.stack([-out[:, 0], out[:, 0]], axis=1)
                else:
                    raw = out
                    prob = torch.softmax(torch.from_numpy(out), dim=1).numpy()
                prediction = (prob.argmax(axis=1) if len(prob) else np.zeros(0))
                yield pa.StructArray.from_arrays(
                    [_list_array(raw), _list_array(prob),
                     pa.array(prediction.astype(np.float64), pa.float64())],
                    names=["raw", "probability", "prediction"])
            elif single_output:
                yield pa.array(out[:, 0], pa.float64())
            else:
                yield _list_array(out)

    return arrow_iterator_udf(predict, return_type)
