"""What a job costs on Spark Connect as the bytes shipped to its tasks grow: inside the
function (the closure travels in the plan) against a file in an exchange directory (what
``exchangeDir`` does). Behind :data:`sparkdl.executor.exchange.CLOSURE_MAX_BYTES`.

    python bench/connect_closure.py                 # 0.25 .. 16 MiB, 3 jobs each, 4 partitions

Runs a local[2] Connect server in this process. Every job reads the bytes in each of its 4
tasks; prints the median job time per size for both ways, side by side. A size the server cannot
serialize (its heap) is reported as failed, not retried.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from sparkdl.executor.exchange import Exchange  # noqa: E402

SIZES_MIB = (0.25, 1, 4, 8, 16)   # 32 MiB in a closure killed the server (out of heap)


def _job(index, payload):
    def read_it(batches):
        for _ in batches:
            pass
        yield pa.RecordBatch.from_arrays([pa.array([len(payload.read())], pa.int64())], ["n"])

    t0 = time.perf_counter()
    index.mapInArrow(read_it, "n long").collect()
    return time.perf_counter() - t0


def main():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH"))
                                               if p)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.remote("local[2]")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    index = spark.range(0, 4, 1, 4).localCheckpoint()
    inline = Exchange(None, "bench")
    by_file = Exchange(tempfile.mkdtemp(prefix="sparkdl-exchange-"), "bench", limit=0)
    print(f"{'MiB':>6} {'closure s/job':>14} {'file s/job':>11}")
    for mib in SIZES_MIB:
        data = np.ones(int(mib * (1 << 18)), np.float32).tobytes()
        row = []
        for exchange in (inline, by_file):
            times = []
            try:
                for _ in range(3):
                    payload = exchange.ship(data, "bytes")
                    times.append(_job(index, payload))
                    exchange.discard(payload)
                row.append(f"{statistics.median(times):.3f}")
            except Exception as exc:   # e.g. the server's heap: report and go on
                row.append(f"failed ({type(exc).__name__})")
        print(f"{mib:6} {row[0]:>14} {row[1]:>11}")
    by_file.close()
    spark.stop()


if __name__ == "__main__":
    main()
