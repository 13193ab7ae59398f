"""GPU scheduling without GPUs: a local-cluster whose workers report fake GPUs (own process).

    python gpu_cluster_job.py MODE DISCOVERY_SCRIPT MARKER_DIR OUT.json OUT.pt

MODE ``global``: every task asks for a GPU (spark.task.resource.gpu.amount=1); then a run with
``device="cuda"`` meets a task-side DeviceError (no CUDA here), which must reach the driver as
itself after one attempt.
MODE ``profile``: executors have GPUs but tasks ask for none by default; sparkdl's gradient stage
asks for one through a task resource profile; then a fit in local rounds, whose round stages ask
the same way (saved to OUT.pt.rounds).

Writes what plain (ETL) tasks saw, which GPU addresses the gradient tasks were given (markers
written by the criterion) and the engine's log of its device decisions; saves the weights.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from models import AddressRecordingLoss, SmallNet, classification_data, make_rdd  # noqa: E402


def main() -> None:
    mode, script, markers, out_json, out_pt = sys.argv[1:6]
    from pyspark.sql import SparkSession

    from conftest import spark_builder
    from sparkdl import DistriOptimizer
    from sparkdl.triggers import MaxIteration

    builder = (spark_builder("local-cluster[2,1,1024]")
               .config("spark.worker.resource.gpu.amount", "2")
               .config("spark.worker.resource.gpu.discoveryScript", script)
               .config("spark.executor.resource.gpu.amount", "2")
               .config("spark.executor.resource.gpu.discoveryScript", script))
    if mode == "global":
        builder = builder.config("spark.task.resource.gpu.amount", "1")
    spark: SparkSession = builder.getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())   # type: ignore[method-assign]
    logging.getLogger("sparkdl").addHandler(handler)
    logging.getLogger("sparkdl").setLevel(logging.INFO)

    def etl(_):
        from pyspark import TaskContext

        gpu = TaskContext.get().resources().get("gpu")
        return list(gpu.addresses) if gpu is not None else []

    etl_seen = sc.parallelize(range(4), 4).map(etl).collect()
    x, y = classification_data(100, seed=1)
    torch.manual_seed(7)
    net = SmallNet()
    opt = DistriOptimizer(net, make_rdd(sc, list(zip(x, y)), [40, 25, 35]),
                          AddressRecordingLoss(markers), torch.optim.SGD(net.parameters(), lr=0.1),
                          batch_size=16, end_trigger=MaxIteration(4), seed=5, device="auto",
                          allreduce="shuffle", progress_bar=False)
    opt.optimize()
    torch.save(net.state_dict(), out_pt)
    rounds_markers = []
    if mode == "profile":    # local rounds take the same path to the tasks' devices
        rounds_dir = os.path.join(markers, "rounds")
        os.makedirs(rounds_dir)
        torch.manual_seed(7)
        rounds_net = SmallNet()
        DistriOptimizer(rounds_net, make_rdd(sc, list(zip(x, y)), [40, 25, 35]),
                        AddressRecordingLoss(rounds_dir),
                        torch.optim.SGD(rounds_net.parameters(), lr=0.1, momentum=0.9),
                        batch_size=16, end_trigger=MaxIteration(6), seed=5, device="auto",
                        allreduce="shuffle", progress_bar=False, local_steps=3,
                        outer_optimizer="nesterov").optimize()
        torch.save(rounds_net.state_dict(), out_pt + ".rounds")
        rounds_markers = sorted(os.listdir(rounds_dir))
    cuda = {}
    if mode == "global":   # device="cuda" where CUDA is missing: a task-side DeviceError
        sc.setJobGroup("cuda", "device=cuda without CUDA")
        try:
            other = SmallNet()
            DistriOptimizer(other, make_rdd(sc, list(zip(x, y)), [40, 25, 35]),
                            torch.nn.CrossEntropyLoss(),
                            torch.optim.SGD(other.parameters(), lr=0.1),
                            batch_size=16, end_trigger=MaxIteration(2), seed=5, device="cuda",
                            progress_bar=False).optimize()
        except Exception as exc:      # noqa: BLE001 - what reached the driver, as it is
            cuda = {"type": type(exc).__name__, "module": type(exc).__module__,
                    "message": str(exc)}
        tracker = sc.statusTracker()
        stages = [s for j in tracker.getJobIdsForGroup("cuda")
                  for s in (tracker.getJobInfo(j).stageIds if tracker.getJobInfo(j) else [])]
        cuda["failed_tasks"] = sum(tracker.getStageInfo(s).numFailedTasks for s in stages
                                   if tracker.getStageInfo(s) is not None)
        cuda["max_failures"] = sc.getConf().get("spark.task.maxFailures", "4")
    with open(out_json, "w") as f:
        json.dump({"etl": etl_seen, "rounds_markers": rounds_markers,
                   "markers": sorted(m for m in os.listdir(markers) if m != "rounds"),
                   "log": [m for m in records if "device" in m or "GPU" in m],
                   "cuda": cuda}, f)
    spark.stop()


if __name__ == "__main__":
    main()
