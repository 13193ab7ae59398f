"""A small training run in its own driver process (only one SparkContext can live in a process).

    python cluster_job.py MASTER OUT.pt [--fault task|executor|executor-validation
                          --marker PATH] [--secure] [--checkpoint DIR] [--iterations N]
                          [--allreduce auto|shuffle|driver] [--validation]

Prints the number of executors, the number of finished iterations, and saves the trained
state_dict. Used by the tests that need a master other than the session's local[2], faults, or a
driver that gets killed.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from models import FaultInjectingLoss, SmallNet, classification_data, make_rdd  # noqa: E402

SIZES = [40, 0, 25, 35]
BATCH = 16
ITERATIONS = 6
SEED = 5


def train(sc, iterations=ITERATIONS, criterion=None, checkpoint=None, allreduce="auto",
          validation=False):
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration, SeveralIteration

    x, y = classification_data(sum(SIZES), seed=1)
    torch.manual_seed(7)
    net = SmallNet()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), SIZES),
                          criterion or torch.nn.CrossEntropyLoss(), optimizer,
                          batch_size=BATCH, end_trigger=MaxIteration(iterations), seed=SEED,
                          lr_scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.7),
                          allreduce=allreduce)
    if validation:
        from sparkdl import Loss, Top1Accuracy

        vx, vy = classification_data(60, seed=2)
        opt.set_validation(make_rdd(sc, list(zip(vx, vy)), [20, 25, 15]), SeveralIteration(2),
                           [Top1Accuracy(threshold=0.0), Loss()], batch_size=8)
    if checkpoint:
        opt.set_checkpoint(checkpoint, SeveralIteration(2), keep_last=2)
    trained = opt.optimize()
    return trained, opt


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("master")
    p.add_argument("out")
    p.add_argument("--fault", choices=["task", "executor", "executor-validation"])
    p.add_argument("--allreduce", default="auto")
    p.add_argument("--validation", action="store_true")
    p.add_argument("--marker")
    p.add_argument("--secure", action="store_true")
    p.add_argument("--checkpoint")
    p.add_argument("--iterations", type=int, default=ITERATIONS)
    args = p.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import logging

    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    from conftest import spark_builder

    builder = spark_builder(args.master).config("spark.executor.memory", "768m")
    if args.secure:
        builder = (builder.config("spark.authenticate", "true")
                   .config("spark.authenticate.secret", uuid.uuid4().hex)
                   .config("spark.network.crypto.enabled", "true")
                   .config("spark.io.encryption.enabled", "true"))
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    criterion = FaultInjectingLoss(args.fault, args.marker) if args.fault else None
    trained, opt = train(sc, args.iterations, criterion, args.checkpoint, args.allreduce,
                         args.validation)
    if args.secure:  # inference too: an Arrow UDF over a DataFrame on the secured cluster
        from sparkdl import NNClassifierModel

        x, _ = classification_data(50, seed=9)
        df = spark.createDataFrame([(row.tolist(),) for row in x], ["features"])
        rows = NNClassifierModel(trained).transform(df).filter("prediction >= 0").count()
        print(f"inference_rows={rows}")
    executors = sc._jsc.sc().getExecutorMemoryStatus().size() - 1
    torch.save(trained.state_dict(), args.out)
    print(f"executors={executors}")
    print(f"iterations={len(opt.summary.iterations)}")
    print(f"validations={[v.metrics for v in opt.summary.validations]}")
    spark.stop()


if __name__ == "__main__":
    main()
