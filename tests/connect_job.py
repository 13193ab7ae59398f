"""The estimators under Spark Connect, in a process of their own (a local Connect server).

    python connect_job.py DATA_DIR OUT_DIR [--phase main|fills]

``main``: fit and transform of NNClassifier and NNEstimator, the engine's shuffle AllReduce as
DataFrame jobs, a model above the closure limit through ``exchangeDir``, save / overwrite /
load, a Pipeline, a CrossValidator with parallelism 2, three fits trained as one pass on each
AllReduce path, and the errors for bad input.
``fills``: a server whose Python workers are never reused and keep shards in memory only
(``spark.io.encryption.enabled``), so every task misses its shard and fill jobs build them (a
single fit's and a pass's).

Writes weights (``*.pt``), predictions (``*.npy``) and ``results.json`` into OUT_DIR. The data
and the fits are the functions below, which tests/test_spark_connect.py also runs on its
classic session to compare.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

USERS, EMBED = 12000, 192          # 2.3 M parameters: 8.8 MiB, above the 8 MiB closure limit


def write_data(spark, data_dir):
    """The data sets, as Parquet files that both sessions read (the same partitions)."""
    import pandas as pd

    rng = np.random.default_rng(0)
    n = 360
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.8).astype(np.int64)
    clf = pd.DataFrame({"id": np.arange(n), "features": x.tolist(), "a": x[:, 0].astype(float),
                        "b": x[:, 1].astype(float), "c": x[:, 2].astype(float), "label": y,
                        "text_label": np.where(y > 0, "yes", "no"),
                        "is_val": rng.random(n) < 0.2})
    spark.createDataFrame(clf).coalesce(1).write.mode("overwrite").parquet(f"{data_dir}/clf")
    users = rng.integers(0, USERS, size=400)
    ids = pd.DataFrame({"user": users, "rating": (users % 5).astype(np.float32) / 2})
    spark.createDataFrame(ids).coalesce(1).write.mode("overwrite").parquet(f"{data_dir}/ids")


def mlp():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def classifier(**params):
    from sparkdl import NNClassifier

    settings = dict(model=mlp, criterion=torch.nn.CrossEntropyLoss(), batchSize=32, maxEpoch=2,
                    seed=3, numTrainWorkers=2, learningRate=0.01, progressBar=False)
    settings.update(params)
    return NNClassifier(**settings)


def fit_classifier(spark, data_dir, checkpoint_dir, epochs=2, batch_size=32):
    """Validation rows, validation metrics and checkpoints: the classic fit's features."""
    df = spark.read.parquet(f"{data_dir}/clf")
    return classifier(validationIndicatorCol="is_val", checkpointDir=checkpoint_dir,
                      validationMetrics=["loss", "accuracy"], maxEpoch=epochs,
                      batchSize=batch_size).fit(df)


def fit_regressor(spark, data_dir):
    from sparkdl import NNEstimator

    torch.manual_seed(4)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1),
                              torch.nn.Flatten(0))
    df = spark.read.parquet(f"{data_dir}/clf")
    return NNEstimator(model=net, criterion=torch.nn.MSELoss(), featuresCols=["a", "b", "c"],
                       labelCol="c", batchSize=40, maxEpoch=2, seed=1, numTrainWorkers=3,
                       optimizer="sgd", momentum=0.9, learningRate=0.05,
                       progressBar=False).fit(df)


def engine_shuffle(spark, data_dir, connect, iterations=6):
    """The engine on the estimators' DataFrame blocks with the shuffle AllReduce in 3 blocks
    (an RDD on the classic session, DataFrame jobs under Connect)."""
    from sparkdl import DistriOptimizer
    from sparkdl.data.dataframe_arrays import feature_sources, frame_blocks
    from sparkdl.triggers import MaxIteration

    df = spark.read.parquet(f"{data_dir}/clf")
    blocks = frame_blocks(df, feature_sources(df.schema, "features", []), "label", True, [],
                          None, 2)
    net = mlp()
    opt = DistriOptimizer(net, blocks if connect else blocks.to_rdd(),
                          torch.nn.CrossEntropyLoss(),
                          torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                          batch_size=48, end_trigger=MaxIteration(iterations), seed=9,
                          allreduce="shuffle", num_blocks=3, progress_bar=False)
    opt.optimize()
    return net, opt.summary


PASS_FITS = ((0.1, 48, 9, 4, None), (0.05, 48, 9, 4, None), (0.1, 36, 3, 3, "bf16"))
"""lr, batch size, seed, iterations and compression of the three fits of engine_pass."""
FILLS_PASS_FITS = tuple((lr, batch, seed, 2, compression)
                        for lr, batch, seed, _, compression in PASS_FITS[:2])
"""The fills phase's pass: two fits of two iterations (every task there starts a Python worker)."""


def engine_pass(spark, data_dir, connect, allreduce, together=True, fits=PASS_FITS):
    """Fits over the same DataFrame blocks: another learning rate, another batch size, seed,
    length and bf16 gradients; trained as one pass (``together``: sparkdl.FitSet) or each alone. Returns the
    models and the FitSet's passes and jobs (None alone)."""
    from sparkdl import DistriOptimizer, FitSet
    from sparkdl.data.dataframe_arrays import feature_sources, frame_blocks
    from sparkdl.triggers import MaxIteration

    df = spark.read.parquet(f"{data_dir}/clf")
    blocks = frame_blocks(df, feature_sources(df.schema, "features", []), "label", True, [],
                          None, 2)
    data = blocks if connect else blocks.to_rdd()
    opts = []
    for lr, batch, seed, iterations, compression in fits:
        net = mlp()
        opts.append(DistriOptimizer(net, data, torch.nn.CrossEntropyLoss(),
                                    torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9),
                                    batch_size=batch, end_trigger=MaxIteration(iterations),
                                    seed=seed, allreduce=allreduce,
                                    num_blocks=3 if allreduce == "shuffle" else None,
                                    compression=compression, progress_bar=False))
    if not together:
        for opt in opts:
            opt.optimize()
        return [opt.model for opt in opts], None, None
    fit_set = FitSet(opts)
    fit_set.run()
    return [opt.model for opt in opts], fit_set.passes, fit_set.jobs


def large_estimator(exchange_dir=""):
    from sparkdl import NNEstimator

    def net():
        torch.manual_seed(5)
        return torch.nn.Sequential(torch.nn.Embedding(USERS, EMBED), torch.nn.Linear(EMBED, 1),
                                   torch.nn.Flatten(0))

    return NNEstimator(model=net, criterion=torch.nn.MSELoss(), inputCols=["user"],
                       labelCol="rating", batchSize=100, maxEpoch=1, seed=2, numTrainWorkers=2,
                       optimizer="sgd", learningRate=0.5, progressBar=False,
                       exchangeDir=exchange_dir)


def fit_large(spark, data_dir, exchange_dir=""):
    return large_estimator(exchange_dir).fit(spark.read.parquet(f"{data_dir}/ids"))


def fit_sparse_tables(spark, data_dir):
    """A table with sparse gradients (SparseAdam) and a dense head (SGD): two optimizers."""
    from sparkdl import NNEstimator

    def net():
        torch.manual_seed(6)
        return torch.nn.Sequential(torch.nn.Embedding(USERS, 4, sparse=True),
                                   torch.nn.Linear(4, 1), torch.nn.Flatten(0))

    def optimizers(params, lr, model):
        return [torch.optim.SparseAdam(model[0].parameters(), lr=lr),
                torch.optim.SGD(model[1].parameters(), lr=lr)]

    return NNEstimator(model=net, criterion=torch.nn.MSELoss(), inputCols=["user"],
                       labelCol="rating", batchSize=100, maxEpoch=1, seed=2, numTrainWorkers=2,
                       optimizerFactory=optimizers, learningRate=0.05, progressBar=False
                       ).fit(spark.read.parquet(f"{data_dir}/ids"))


def cross_validate(spark, data_dir):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    df = spark.read.parquet(f"{data_dir}/clf")
    clf = classifier(maxEpoch=1)
    grid = ParamGridBuilder().addGrid(clf.learningRate, [0.01, 0.05]).build()
    cv = CrossValidator(estimator=clf, estimatorParamMaps=grid, numFolds=2, parallelism=2,
                        seed=7, evaluator=MulticlassClassificationEvaluator(
                            metricName="accuracy"))
    return cv.fit(df)


def predictions(model, df, column="prediction"):
    rows = model.transform(df).select("id", column).orderBy("id").collect()
    return np.array([r[1] for r in rows], dtype=np.float64)


def _error(fn):
    try:
        fn()
    except Exception as exc:               # the test reads the type and message
        return f"{type(exc).__name__}: {exc}"
    return None


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def main_phase(spark, data_dir, out, results):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    from sparkdl import DistriOptimizer, NNClassifier, NNClassifierModel

    df = spark.read.parquet(f"{data_dir}/clf")
    model = fit_classifier(spark, data_dir, f"{out}/checkpoints")
    torch.save(model.state_dict(), f"{out}/classifier.pt")
    np.save(f"{out}/classifier_pred.npy", predictions(model, df))
    results["classifier_summary"] = model.summary.to_dict(orient="list")
    results["checkpoints"] = sorted(os.listdir(f"{out}/checkpoints"))

    torch.save(fit_regressor(spark, data_dir).state_dict(), f"{out}/regressor.pt")
    net, summary = engine_shuffle(spark, data_dir, connect=True)
    torch.save(net.state_dict(), f"{out}/shuffle.pt")
    torch.save(fit_sparse_tables(spark, data_dir).state_dict(), f"{out}/sparse_tables.pt")
    for path in ("driver", "shuffle"):
        nets, passes, jobs = engine_pass(spark, data_dir, True, path)
        torch.save([n.state_dict() for n in nets], f"{out}/pass_{path}.pt")
        results[f"pass_{path}"] = {"passes": passes, "jobs": jobs}

    # save / overwrite / load, and the estimator itself
    path = f"{out}/saved_model"
    model.write().save(path)
    results["save_twice_error"] = _error(lambda: model.write().save(path))
    model.write().overwrite().save(path)
    loaded = NNClassifierModel.load(path)
    np.save(f"{out}/loaded_pred.npy", predictions(loaded, df))
    classifier(maxEpoch=3).write().overwrite().save(f"{out}/saved_estimator")
    results["loaded_estimator_maxEpoch"] = \
        NNClassifier.load(f"{out}/saved_estimator").getOrDefault("maxEpoch")

    # a Pipeline: VectorAssembler (a JVM stage, through Connect ML) then the classifier
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["a", "b", "c"], outputCol="vec"),
                                classifier(featuresCol="vec", model=lambda: torch.nn.Linear(3, 3),
                                           maxEpoch=3, learningRate=0.05)])
    fitted = pipeline.fit(df)
    np.save(f"{out}/pipeline_pred.npy", predictions(fitted, df))
    fitted.write().overwrite().save(f"{out}/saved_pipeline")
    np.save(f"{out}/pipeline_loaded_pred.npy",
            predictions(PipelineModel.load(f"{out}/saved_pipeline"), df))

    cv_model = cross_validate(spark, data_dir)
    results["cv_metrics"] = [float(m) for m in cv_model.avgMetrics]
    results["cv_best_type"] = type(cv_model.bestModel).__name__

    # bad input: errors before any cluster work
    results["string_label_error"] = _error(lambda: classifier(labelCol="text_label").fit(df))
    results["missing_column_error"] = _error(lambda: classifier(featuresCol="nope").fit(df))
    results["large_without_exchange_error"] = _error(lambda: fit_large(spark, data_dir))
    results["engine_api_error"] = _error(lambda: DistriOptimizer(
        mlp(), df, torch.nn.CrossEntropyLoss(), torch.optim.SGD(mlp().parameters(), lr=0.1),
        batch_size=8))

    lines = _Lines()
    logging.getLogger("sparkdl").addHandler(lines)
    large = fit_large(spark, data_dir, f"{out}/exchange")
    logging.getLogger("sparkdl").removeHandler(lines)
    torch.save(large.state_dict(), f"{out}/large.pt")
    results["large_log"] = [line for line in lines.lines if "training on" in line]
    results["exchange_left"] = os.listdir(f"{out}/exchange") if os.path.isdir(
        f"{out}/exchange") else []
    np.save(f"{out}/large_pred.npy",
            np.array([r[0] for r in large.transform(spark.read.parquet(f"{data_dir}/ids"))
                      .select("prediction").collect()]))


def fills_phase(spark, data_dir, out, results):
    net, summary = engine_shuffle(spark, data_dir, connect=True, iterations=2)
    torch.save(net.state_dict(), f"{out}/fills_shuffle.pt")
    nets, passes, jobs = engine_pass(spark, data_dir, True, "shuffle", fits=FILLS_PASS_FITS)
    torch.save([n.state_dict() for n in nets], f"{out}/fills_pass.pt")
    results["fills_pass"] = {"passes": passes, "jobs": jobs}
    results["fills_misses"] = summary.placement_misses
    results["fills_rebuilt"] = summary.shards_rebuilt
    model = fit_classifier(spark, data_dir, "", epochs=1, batch_size=144)   # 2 iterations
    torch.save(model.state_dict(), f"{out}/fills_classifier.pt")


def hold_the_connect_port() -> None:
    """Wait until no other process of this machine runs a local Connect server, and keep it so
    until this process ends: ``remote("local[2]")`` serves on port 15002 and its client connects
    there, so two at once (CI runs two pyspark versions' tests side by side) fail to bind."""
    import fcntl

    path = os.environ.get("SPARKDL_CONNECT_LOCK", "/tmp/sparkdl-connect-15002.lock")
    handle = open(path, "a")
    fcntl.flock(handle, fcntl.LOCK_EX)          # released when this process exits
    hold_the_connect_port.handle = handle       # type: ignore[attr-defined]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("out")
    parser.add_argument("--phase", default="main", choices=["main", "fills"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    hold_the_connect_port()
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.remote("local[2]")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.default.parallelism", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    if args.phase == "fills":
        builder = (builder.config("spark.python.worker.reuse", "false")
                   .config("spark.io.encryption.enabled", "true")
                   .config("spark.sparkdl.shardReplicas", "2"))
    spark = builder.getOrCreate()
    results = {"connect": type(spark).__module__}

    class Replicas(logging.Handler):          # what the fits say of shardReplicas
        def emit(self, record):
            if "shardReplicas" in record.getMessage():
                results.setdefault("replicas_said", []).append(record.getMessage())

    logging.getLogger("sparkdl").addHandler(Replicas())
    os.makedirs(args.out, exist_ok=True)
    try:
        (main_phase if args.phase == "main" else fills_phase)(spark, args.data_dir, args.out,
                                                              results)
    except Exception:
        results["failure"] = traceback.format_exc()
        raise
    finally:
        with open(os.path.join(args.out, f"results-{args.phase}.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
        spark.stop()


if __name__ == "__main__":
    main()
