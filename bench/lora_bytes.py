"""Bytes through the driver per iteration: LoRA (r = 8 on the attention projections) against the
whole model training, on a tiny, a ~10M- and a ~100M-parameter Llama-like base
(``bench/llama_bases.py``).

    python bench/lora_bytes.py                          # local[2], every size, 6 iterations
    python bench/lora_bytes.py --sizes 100M             # the realistic size alone
    python bench/lora_bytes.py --sizes 100M --trains lora   # without training the whole 100M
    python bench/lora_bytes.py --sizes tiny --iterations 4

Each base is built from a config, saved with ``save_pretrained`` into a temporary directory and
fine-tuned with ``PretrainedModel`` through ``DistriOptimizer`` (AdamW, ``huggingface_step``,
random token rows). What is measured is the driver's Python process's I/O per iteration, between
the end trigger's calls at consecutive iterations, median over the iterations after the first
two: the bytes it sends and receives on sockets (``socket.socket``'s send and receive methods,
counted in this process: the summed gradients from the result socket, py4j's calls; Linux's
``/proc/self/io`` does not count socket traffic) plus the growth of ``rchar + wchar`` in
``/proc/self/io`` (files and pipes: the weights' broadcast, which a local master takes as a
file). Beside it: the
model's bytes (every parameter), the trainable bytes (what the flat layout ships), the
pickled model a fit ships once (``shipped_model``: the description and the trainable tensors)
and the base's bytes read by the driver (its files' bytes it read: the config and, with
``modules_to_save``, a head; none here).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from llama_bases import ATTENTION, CONFIGS, save_base  # noqa: E402

SIZES = ["tiny", "10M", "100M"]


SOCKET_BYTES = [0]


def count_socket_bytes() -> None:
    """Count every byte this process's ``socket.socket`` objects send or receive."""
    import socket

    def counted(method, result_bytes):
        def wrapper(self, *args, **kwargs):
            result = method(self, *args, **kwargs)
            SOCKET_BYTES[0] += result_bytes(result, args)
            return result
        return wrapper

    sized = lambda result, args: len(result)                    # noqa: E731
    count = lambda result, args: int(result or 0)               # noqa: E731
    whole = lambda result, args: len(memoryview(args[0]).cast("B"))    # noqa: E731
    socket.socket.recv = counted(socket.socket.recv, sized)
    socket.socket.recv_into = counted(socket.socket.recv_into, count)
    socket.socket.send = counted(socket.socket.send, count)
    socket.socket.sendall = counted(socket.socket.sendall, whole)


def io_bytes() -> int:
    with open("/proc/self/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return int(fields["rchar"]) + int(fields["wchar"]) + SOCKET_BYTES[0]


def measure(sc, path: str, lora: bool, iterations: int, seq: int, rows: int) -> dict:
    from peft import LoraConfig

    from sparkdl import DistriOptimizer
    from sparkdl.adapters import PretrainedModel, huggingface_step
    from sparkdl.adapters.pretrained import shipped_model, trainable_parameters
    from sparkdl.triggers import MaxIteration, Trigger
    from pyspark import cloudpickle

    vocab = CONFIGS[os.path.basename(path)]["vocab_size"]
    rng = np.random.default_rng(0)
    ids = rng.integers(1, vocab, (rows, seq)).astype(np.int64)
    mask = np.ones_like(ids)
    records = [((i, m), i.copy()) for i, m in zip(ids, mask)]
    rdd = sc.parallelize(records, 2)
    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules=ATTENTION) if lora else None
    pretrained = PretrainedModel(path, "AutoModelForCausalLM", peft_config=peft_config)
    marks: list[tuple[int, int]] = []

    class Recording(Trigger):
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, state):
            marks.append((state.iteration, io_bytes()))
            return self.inner(state)

    opt = DistriOptimizer(pretrained, rdd, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3),
                          batch_size=16, end_trigger=Recording(MaxIteration(iterations)),
                          seed=0, training_step=huggingface_step(("input_ids", "attention_mask")),
                          progress_bar=False)
    driver = opt.model
    model_bytes = sum(p.numel() * p.element_size() for p in driver.parameters())
    trainable = sum(p.numel() * p.element_size() for _, p in trainable_parameters(driver))
    shipped = len(cloudpickle.dumps(shipped_model(driver)))
    opt.optimize()
    by_iteration: dict[int, int] = {}
    for iteration, value in marks:
        by_iteration.setdefault(iteration, value)
    steps = sorted(by_iteration)
    deltas = [by_iteration[b] - by_iteration[a] for a, b in zip(steps, steps[1:]) if a >= 2]
    return {"model_bytes": model_bytes, "trainable_bytes": trainable, "shipped_once": shipped,
            "per_iteration": statistics.median(deltas) if deltas else float("nan"),
            "meta": all(p.is_meta for p in driver.parameters() if not p.requires_grad)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--sizes", nargs="+", default=SIZES, choices=SIZES)
    parser.add_argument("--trains", nargs="+", default=["lora", "all"], choices=["lora", "all"],
                        help="LoRA adapters only, the whole model, or both (default)")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--rows", type=int, default=64)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    count_socket_bytes()
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(args.master).appName("lora-bytes")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    print(f"{'base':>5} {'trains':>6} {'model MB':>9} {'trainable MB':>12} {'trainable %':>11} "
          f"{'driver MB/iter':>14} {'/ model':>8} {'shipped once MB':>15} {'base on meta':>12}")
    with tempfile.TemporaryDirectory() as root:
        for size in args.sizes:
            path = save_base(root, size)
            for lora in [t == "lora" for t in args.trains]:
                r = measure(spark.sparkContext, path, lora, args.iterations, args.seq, args.rows)
                mb = 1 / 2**20
                print(f"{size:>5} {'LoRA' if lora else 'all':>6} {r['model_bytes'] * mb:9.3f} "
                      f"{r['trainable_bytes'] * mb:12.4f} "
                      f"{100 * r['trainable_bytes'] / r['model_bytes']:10.2f}% "
                      f"{r['per_iteration'] * mb:14.4f} "
                      f"{r['per_iteration'] / r['model_bytes']:8.4f} "
                      f"{r['shipped_once'] * mb:15.4f} {str(r['meta']):>12}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
