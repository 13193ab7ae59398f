"""Shards at rest (issue: real clusters): files readable by their owner only, and nothing on
disk at all for ``place="memory"`` (what ``spark.io.encryption.enabled`` selects)."""

from __future__ import annotations

import os
import stat

import numpy as np

from sparkdl.executor import shard_store
from sparkdl.runners.cached_rdd import shard_place


def records(n=12):
    rng = np.random.default_rng(0)
    return [(rng.normal(size=5).astype(np.float32), int(i % 3)) for i in range(n)]


def test_disk_shards_are_private_to_their_owner():
    old = os.umask(0o022)
    try:
        summary = shard_store.build_shard("privacy-test", 0, records(), "float32", "disk")
    finally:
        os.umask(old)
    top = os.path.join(shard_store.shard_root(), "privacy-test")
    try:
        for root, dirs, files in os.walk(shard_store.shard_root()):
            for d in dirs:
                assert stat.S_IMODE(os.stat(os.path.join(root, d)).st_mode) == 0o700, d
            for f in files:
                assert stat.S_IMODE(os.stat(os.path.join(root, f)).st_mode) == 0o600, f
        assert summary.count == 12 and summary.executor_dir == shard_store.shard_root()
        shard = shard_store.open_shard("privacy-test", 0)
        np.testing.assert_array_equal(shard.features[0][3], records()[3][0])
    finally:
        shard_store.drop_run("privacy-test")
    assert not os.path.exists(top)


def test_memory_shards_write_nothing():
    before = set(os.listdir(shard_store.shard_root()))
    summary = shard_store.build_shard("memory-test", 1, records(), "float32", "memory")
    try:
        assert summary.count == 12 and summary.executor_dir == ""
        assert set(os.listdir(shard_store.shard_root())) == before
        shard = shard_store.open_shard("memory-test", 1)
        np.testing.assert_array_equal(shard.labels, [r[1] for r in records()])
    finally:
        shard_store.drop_run("memory-test")
    assert shard_store.open_shard("memory-test", 1) is None


def test_io_encryption_selects_memory_shards():
    assert shard_place({"spark.io.encryption.enabled": "true"}) == "memory"
    assert shard_place({"spark.io.encryption.enabled": " TRUE "}) == "memory"
    assert shard_place({}) == "disk"
    assert shard_place({"spark.io.encryption.enabled": "false"}) == "disk"
