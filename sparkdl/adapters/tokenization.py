"""A text column tokenized on the executors with a Hugging Face tokenizer stored beside the
model (what ``tokenizer.save_pretrained`` wrote, usually into the model's own directory).

:func:`tokenize_column` returns the DataFrame with the token columns added (``input_ids``,
``attention_mask``, and for a causal LM ``labels``): the tokenizer runs in the tasks (a
``mapInPandas`` over the rows, each Python worker loading it once from a local copy of its
directory, :func:`sparkdl.storage.pretrained_files.local_copy`), never on the driver's data.
Its output feeds the estimators (``inputCols=["input_ids", "attention_mask"]``) and the engine.

Padding and truncation are the tokenizer's own (``padding="max_length"``, ``truncation=True``,
``max_length``, the tokenizer's ``padding_side`` and pad token): every row comes out with
``max_length`` tokens whichever partition or batch it is in, so a fit's union batch is the
rows the single-process tokenizer gives for the same texts, and the losses' rule
(:mod:`sparkdl.losses`: a token-mean over the union batch) counts exactly the tokens a
single-process run counts. ``padding="longest"`` (``True``) pads each Arrow batch to its own
longest row, which differs between partitions: it is refused. ``labels=True`` adds causal
LM labels: the token ids with ``-100`` (ignored by the loss) wherever the attention mask is 0.

Example::

    tokens = tokenize_column(spark.read.parquet("/data/reviews"), "text", "/models/tiny-bert",
                             max_length=64)
    NNClassifier(model=PretrainedModel("/models/tiny-bert", ...),
                 inputCols=["input_ids", "attention_mask"], labelCol="label", ...).fit(tokens)
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from ..errors import InvalidArgumentError
from ..executor.worker_cache import WorkerCache

__all__ = ["tokenize_column", "load_tokenizer", "tokenize_texts", "IGNORED_LABEL"]

IGNORED_LABEL = -100
"""The label Hugging Face's losses ignore (the padding of ``labels=True``)."""

_TOKENIZERS: WorkerCache[Any] = WorkerCache(capacity=2, freeze=False)


def load_tokenizer(path: str, identity: str | None = None) -> Any:
    """The tokenizer stored at ``path`` (``AutoTokenizer.from_pretrained`` of a local copy of
    the directory), cached in this Python worker by ``identity`` (the directory's content
    identity; computed when not given)."""
    from ..storage.pretrained_files import base_identity, local_copy

    identity = identity or base_identity(path)

    def load() -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(local_copy(path, identity))

    return _TOKENIZERS.get_or_create((identity,), load)


def tokenize_texts(tokenizer: Any, texts: list[str], max_length: int, truncation: Any = True,
                   labels: bool = False) -> dict[str, np.ndarray]:
    """``texts`` through ``tokenizer`` padded to ``max_length`` (int64 arrays ``input_ids``,
    ``attention_mask`` and, with ``labels``, ``labels``): what every task computes for its
    rows, and what a single-process reference computes for the same texts."""
    encoded = tokenizer(list(texts), padding="max_length", truncation=truncation,
                        max_length=max_length, return_attention_mask=True, return_tensors="np")
    ids = np.asarray(encoded["input_ids"], dtype=np.int64)
    mask = np.asarray(encoded["attention_mask"], dtype=np.int64)
    if ids.shape[1] != max_length:
        raise InvalidArgumentError(
            f"A text gives {ids.shape[1]} tokens, more than max_length={max_length}: set "
            "truncation=True (or 'longest_first' / 'only_first') to cut it as the tokenizer "
            "does, or a larger max_length.")
    out = {"input_ids": ids, "attention_mask": mask}
    if labels:
        out["labels"] = np.where(mask == 1, ids, IGNORED_LABEL).astype(np.int64)
    return out


def tokenize_column(df: Any, text_col: str, tokenizer: str, max_length: int,
                    padding: Any = "max_length", truncation: Any = True, labels: bool = False,
                    prefix: str = "") -> Any:
    """``df`` with the token columns of ``text_col`` added (see the module docstring), computed
    on the executors.

    Args:
        df: a DataFrame with a string column ``text_col``.
        text_col: the text column; a null text is an error naming it.
        tokenizer: the directory ``tokenizer.save_pretrained`` wrote (a local path, ``file:``
            URI or any URI ``pyarrow.fs`` reaches; the model's own directory when the tokenizer
            was saved beside it).
        max_length: the tokens per row (longer texts are truncated, shorter ones padded).
        padding: ``"max_length"`` (the only padding whose result does not depend on how the
            rows are split into partitions).
        truncation: as the tokenizer takes it (``True``, ``"longest_first"``, ``"only_first"``;
            ``False`` makes a text longer than ``max_length`` an error).
        labels: add ``labels`` (causal LM labels, ``-100`` on the padding).
        prefix: put before the added columns' names (``"q_"`` gives ``q_input_ids``, ...).

    Example::

        tokenize_column(df, "text", "/models/tiny-llama", max_length=128, labels=True)
    """
    from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

    from ..storage.pretrained_files import base_identity

    if padding not in ("max_length",):
        raise InvalidArgumentError(
            f"tokenize_column pads to max_length only; got padding={padding!r}. Padding to "
            "each batch's longest text would give partitions rows of different lengths.")
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
        raise InvalidArgumentError(f"tokenize_column's max_length must be a positive int; got "
                                   f"{max_length!r}.")
    if text_col not in df.columns:
        raise InvalidArgumentError(f"tokenize_column: the DataFrame has no column "
                                   f"{text_col!r} (its columns: {df.columns}).")
    field = df.schema[text_col]
    if not isinstance(field.dataType, StringType):
        raise InvalidArgumentError(f"tokenize_column: the column {text_col!r} must be a string "
                                   f"column; it is {field.dataType.simpleString()}.")
    names = ["input_ids", "attention_mask"] + (["labels"] if labels else [])
    taken = [prefix + n for n in names if prefix + n in df.columns]
    if taken:
        raise InvalidArgumentError(f"tokenize_column would overwrite the columns {taken}: drop "
                                   "them or give a prefix.")
    identity = base_identity(tokenizer)      # also: the directory exists
    load_tokenizer(tokenizer, identity)      # a directory without a tokenizer fails here
    schema = StructType(list(df.schema.fields) + [
        StructField(prefix + n, ArrayType(LongType(), False), False) for n in names])

    def tokenize(batches: Iterator[Any]) -> Iterator[Any]:
        tok = load_tokenizer(tokenizer, identity)
        for batch in batches:
            texts = batch[text_col]
            if texts.isna().any():
                raise InvalidArgumentError(
                    f"tokenize_column: the column {text_col!r} holds a null text.")
            out = tokenize_texts(tok, texts.tolist(), max_length, truncation, labels)
            for n in names:
                batch[prefix + n] = list(out[n])
            yield batch

    return df.mapInPandas(tokenize, schema)
