"""Trains the same small models under whichever pyspark this interpreter has, for
``test_same_weights_across_spark_versions``:

    python spark_version_job.py OUT.pt

Writes ``{"pyspark": version, "engine": state_dict, "estimator": state_dict,
"predictions": tensor}`` to OUT.pt: a CNN trained by the engine (SGD with momentum and weight
decay, dropout, the shuffle AllReduce, uneven partitions) and an ``NNClassifier`` fitted on a
DataFrame (Adam, vector features) and applied with ``transform``. The data comes from torch's
generator, so numpy's version plays no part.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def cnn() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3))


def classifier() -> torch.nn.Module:
    torch.manual_seed(4)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def engine_weights(sc) -> dict:
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxEpoch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(150, 1, 8, 8, generator=g)
    y = torch.randint(0, 3, (150,), generator=g)
    rdd = sc.parallelize(list(zip(x.numpy(), y.numpy())), 3)
    net = cnn()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    opt = DistriOptimizer(net, rdd, torch.nn.CrossEntropyLoss(), optimizer, batch_size=32,
                          end_trigger=MaxEpoch(3), seed=7, allreduce="shuffle",
                          progress_bar=False)
    return opt.optimize().state_dict()


def estimator_weights(spark) -> tuple[dict, torch.Tensor, torch.Tensor]:
    from pyspark.ml.linalg import Vectors

    from sparkdl import NNClassifier

    g = torch.Generator().manual_seed(1)
    x = torch.randn(120, 5, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    rows = [(Vectors.dense(r.tolist()), float(t)) for r, t in zip(x, y)]
    df = spark.createDataFrame(rows, ["features", "label"]).repartition(2)
    model = NNClassifier(model=classifier, criterion=torch.nn.CrossEntropyLoss(),
                         batchSize=40, maxEpoch=4, seed=9, numTrainWorkers=2, optimizer="adam",
                         learningRate=0.01, progressBar=False).fit(df)
    scored = model.transform(spark.createDataFrame(rows, ["features", "label"]).coalesce(1))
    rows = scored.select("rawPrediction", "probability").collect()
    return model.module.state_dict(), torch.tensor([r.rawPrediction.toArray() for r in rows]), \
        torch.tensor([r.probability.toArray() for r in rows])


def main() -> None:
    import pyspark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from conftest import spark_builder

    spark = spark_builder("local[2]").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    engine = engine_weights(spark.sparkContext)
    estimator, raw, probability = estimator_weights(spark)
    torch.save({"pyspark": pyspark.__version__, "engine": engine, "estimator": estimator,
                "raw": raw, "probability": probability}, sys.argv[1])
    spark.stop()


if __name__ == "__main__":
    main()
