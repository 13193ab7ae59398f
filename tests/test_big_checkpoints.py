"""A checkpoint above 250 MB is written and resumed bitwise on a default 1 GiB driver (issue 22,
acceptance 3): checkpoint files travel through py4j in chunks of a few MiB, never as one string
(one ~260 MB py4j call failed before)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from models import bitwise_equal

HERE = os.path.dirname(os.path.abspath(__file__))


def run(*args: str) -> str:
    proc = subprocess.run([sys.executable, os.path.join(HERE, "big_checkpoint_job.py"), *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


@pytest.mark.cluster
def test_a_checkpoint_above_250_mb_is_written_and_resumed_bitwise(tmp_path):
    ckpt = tmp_path / "ckpt"
    whole_log = run(str(tmp_path / "whole.pt"), "3", str(ckpt))  # checkpoint at iteration 2
    files = [f for f in os.listdir(ckpt) if f.startswith("checkpoint-")]
    assert files == ["checkpoint-0000000002.pt"]
    assert os.path.getsize(ckpt / files[0]) > 250e6
    log = run(str(tmp_path / "resumed.pt"), "3", str(ckpt))   # a new driver resumes at 2
    assert "resuming from checkpoint" in log and "0000000002.pt: iteration 2," in log, log[-2000:]
    resumed, whole = (torch.nn.Linear(2400, 9000) for _ in range(2))
    resumed.load_state_dict(torch.load(tmp_path / "resumed.pt", weights_only=True))
    whole.load_state_dict(torch.load(tmp_path / "whole.pt", weights_only=True))
    digests = "\n".join(ln for text in (whole_log, log) for ln in text.splitlines()
                         if ln.startswith("digest iteration"))
    assert bitwise_equal(resumed, whole), digests
    at_two = torch.nn.Linear(2400, 9000)        # the checkpoint's weights: iteration 3 trained
    at_two.load_state_dict(torch.load(ckpt / files[0], weights_only=False)["model_state"])
    assert not bitwise_equal(at_two, whole)


def test_read_bytes_holds_the_file_once(sc, tmp_path, monkeypatch):
    """A file read through the JVM lands in one buffer that becomes the returned bytes (issue
    35): the driver's peak is the file plus the decoding of one py4j chunk, not the file twice
    (a bytearray copied into bytes held 2 x 16 MiB)."""
    import tracemalloc

    from sparkdl.storage import hadoop_files

    chunk = 64 << 10
    monkeypatch.setattr(hadoop_files, "CHUNK_BYTES", chunk)
    size = 16 << 20
    data = os.urandom(size - 5)                      # not a multiple of the chunk
    (tmp_path / "big.bin").write_bytes(data)
    hadoop_files.read_bytes(sc, f"file://{tmp_path}", "big.bin")   # warm py4j's classes
    tracemalloc.start()
    try:
        read = hadoop_files.read_bytes(sc, f"file://{tmp_path}", "big.bin")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert type(read) is bytes and read == data
    # py4j decodes a chunk through a list of its byte values: about 10 x the chunk at once
    assert peak < size + 16 * chunk, (peak - size) / chunk
    assert hadoop_files.read_bytes(sc, f"file://{tmp_path}", "big.bin") == data
