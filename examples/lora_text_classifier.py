"""Fine-tunes a pretrained text classifier with LoRA from a table of texts, saves the adapter,
and scores a table with it in a second job.

    python examples/lora_text_classifier.py --work-dir lora-demo            # train, evaluate, save
    python examples/lora_text_classifier.py --work-dir lora-demo --score    # the scoring job
    spark-submit --master local[2] examples/lora_text_classifier.py --work-dir lora-demo

Nothing is downloaded. The training job first writes what a real project already has:

* ``base/``: a small BERT-like sequence classifier and its word-level tokenizer, saved with
  ``save_pretrained`` (a stand-in for a checkpoint from the Hugging Face Hub; give any other
  directory with ``--base``);
* ``reviews/``: a Parquet table of short reviews (``text``, ``label``: 1 when the review holds a
  positive word, 0 for a negative one) and ``new_reviews/``, the rows to score later.

It then reads the table, tokenizes the text on the executors with the tokenizer beside the model
(``tokenize_column``), fine-tunes ``PretrainedModel(base, ..., peft_config=LoraConfig(...))``
with ``NNClassifier`` (the executors load the base; only the adapters and the head travel),
prints the held-out accuracy, saves the fitted model to ``adapter/`` (peft's adapter files and
a reference to the base, a few hundred KB) and writes ``holdout_predictions/``.

``--score`` is the second job: it loads ``adapter/`` with ``NNClassifierModel.load`` (the base
read from its path and checked against its recorded identity), tokenizes ``new_reviews/`` and
writes ``scored/`` (``text``, ``prediction``, ``prob_positive``).
"""

from __future__ import annotations

import argparse
import logging
import os

POSITIVE = ["good", "great", "fine", "lovely", "superb", "neat"]
NEGATIVE = ["bad", "awful", "poor", "dull", "broken", "sad"]
NEUTRAL = [f"word{i}" for i in range(40)]
MAX_LENGTH = 12

log = logging.getLogger("lora_example")


def write_base(directory: str, seed: int) -> None:
    """A small BERT-like classifier and its word-level tokenizer, saved with save_pretrained."""
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    words = POSITIVE + NEGATIVE + NEUTRAL
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, **{w: i + 3 for i, w in enumerate(words)}}
    core = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]",
                                        unk_token="[UNK]", cls_token="[CLS]")
    torch.manual_seed(seed)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32, num_labels=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def reviews(n: int, seed: int) -> list[tuple[str, int]]:
    """Reviews of 4 to 10 words: neutral words and one positive or negative word."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        label = int(rng.integers(0, 2))
        words = list(rng.choice(NEUTRAL, int(rng.integers(3, 10))))
        words.insert(int(rng.integers(0, len(words) + 1)),
                     str(rng.choice(POSITIVE if label else NEGATIVE)))
        rows.append(("[CLS] " + " ".join(words), label))
    return rows


def train(spark, args) -> None:
    from peft import LoraConfig
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.sql import functions as F

    from sparkdl import NNClassifier
    from sparkdl.adapters import PretrainedModel, huggingface_step, tokenize_column

    work = args.work_dir
    base = args.base or os.path.join(work, "base")
    if not args.base:
        write_base(base, args.seed)
    spark.createDataFrame(reviews(args.rows, args.seed), ["text", "label"]) \
        .write.mode("overwrite").parquet(os.path.join(work, "reviews"))
    spark.createDataFrame(reviews(args.rows // 4, args.seed + 1), ["text", "label"]) \
        .write.mode("overwrite").parquet(os.path.join(work, "new_reviews"))

    table = spark.read.parquet(os.path.join(work, "reviews"))
    tokens = tokenize_column(table, "text", base, max_length=MAX_LENGTH)
    train_df, test_df = tokens.randomSplit([0.8, 0.2], seed=args.seed)
    clf = NNClassifier(
        model=PretrainedModel(base, "AutoModelForSequenceClassification",
                              peft_config=LoraConfig(r=8, lora_alpha=16,
                                                     target_modules=["query", "value"],
                                                     modules_to_save=["classifier"])),
        trainingStep=huggingface_step(("input_ids", "attention_mask")),
        inputCols=["input_ids", "attention_mask"], labelCol="label", optimizer="adamw",
        learningRate=args.lr, batchSize=32, maxEpoch=args.epochs, seed=args.seed,
        progressBar=False)
    fitted = clf.fit(train_df)
    scored = fitted.transform(test_df)
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored)
    print(f"test accuracy: {accuracy:.4f}")
    fitted.write().overwrite().save(os.path.join(work, "adapter"))
    log.info("saved the adapter to %s", os.path.join(work, "adapter"))
    holdout = tokenize_column(spark.read.parquet(os.path.join(work, "new_reviews")), "text",
                              base, max_length=MAX_LENGTH)
    (fitted.transform(holdout)
     .select("text", "prediction", F.udf(lambda v: float(v[1]), "double")("probability")
             .alias("prob_positive"))
     .write.mode("overwrite").parquet(os.path.join(work, "holdout_predictions")))


def score(spark, args) -> None:
    import json

    from pyspark.sql import functions as F

    from sparkdl import NNClassifierModel
    from sparkdl.adapters import tokenize_column

    adapter = os.path.join(args.work_dir, "adapter")
    model = NNClassifierModel.load(adapter)
    with open(os.path.join(adapter, "sparkdl_base.json")) as f:
        base = json.load(f)["path"]          # the tokenizer is saved beside the base
    rows = spark.read.parquet(os.path.join(args.work_dir, "new_reviews"))
    tokens = tokenize_column(rows, "text", base, max_length=MAX_LENGTH)
    scored = (model.transform(tokens)
              .select("text", "prediction", F.udf(lambda v: float(v[1]), "double")(
                  "probability").alias("prob_positive")))
    scored.write.mode("overwrite").parquet(os.path.join(args.work_dir, "scored"))
    print(f"scored rows: {spark.read.parquet(os.path.join(args.work_dir, 'scored')).count()}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--work-dir", default="lora-demo", help="where the tables, the base and "
                   "the adapter are written")
    p.add_argument("--base", help="a pretrained classifier directory with its tokenizer "
                   "(default: write a small one under --work-dir)")
    p.add_argument("--score", action="store_true", help="the scoring job: load the saved "
                   "adapter and score new_reviews/")
    p.add_argument("--master", default="local[2]", help="Spark master (spark-submit's "
                   "--master wins)")
    p.add_argument("--rows", type=int, default=800)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("sparkdl", "lora_example"):
        logging.getLogger(name).setLevel(logging.INFO)
    args.work_dir = os.path.abspath(args.work_dir)
    if args.base:
        args.base = os.path.abspath(args.base)
    if args.score and not os.path.isdir(os.path.join(args.work_dir, "adapter")):
        log.error("--score: no saved adapter under %s (run the training job first)",
                  args.work_dir)
        return 2

    from sparkdl.spark_settings import spark_session

    spark = spark_session("sparkdl LoRA text classifier", args.master)
    spark.sparkContext.setLogLevel("WARN")
    try:
        (score if args.score else train)(spark, args)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
