"""The exchange directory (Spark Connect's way to ship large weights; issue 22, acceptance 7):
files are verified against the hash they were shipped under, never trusted because of their
name, and private to the user on local paths (in every spelling: issue 35, 5)."""

from __future__ import annotations

import os
import stat

import pytest

from sparkdl.errors import ExchangeError
from sparkdl.executor import exchange
from sparkdl.executor.exchange import Exchange
from sparkdl.storage.arrow_files import resolve
from sparkdl.storage.local_paths import local_path


def test_a_planted_file_is_refused_and_a_reused_name_is_verified(tmp_path):
    ex = Exchange(str(tmp_path), "run-1", limit=4)
    payload = ex.ship(b"the driver's weights", "weights")
    assert payload.name and payload.digest[:16] in payload.name
    path = tmp_path / "run-1" / payload.name
    path.write_bytes(b"planted by someone else")         # swapped after the driver wrote it
    exchange.drop_payloads()
    with pytest.raises(ExchangeError, match="does not hold what the driver wrote"):
        payload.read()

    # a kept, same-named file (transform's model) is checked before it is reused
    model = Exchange(str(tmp_path), "model-1", limit=4)
    first = model.ship(b"model bytes", "model", unique=False)
    (tmp_path / "model-1" / first.name).write_bytes(b"evil pickle")
    again = model.ship(b"model bytes", "model", unique=False)
    assert again.name == first.name
    assert (tmp_path / "model-1" / again.name).read_bytes() == b"model bytes"
    exchange.drop_payloads()
    assert again.read() == b"model bytes"


@pytest.mark.parametrize("spelling", ["{}", "file:{}", "file://{}", "file://localhost{}"])
def test_exchange_files_are_private_on_local_paths(tmp_path, spelling):
    # every spelling of a local directory (issue 35, 5): plain, Hadoop's file:/, file:/// and
    # file://localhost/ all give 0700/0600
    ex = Exchange(spelling.format(tmp_path), "run-2", limit=4)
    assert ex.local and ex.directory == f"{tmp_path}/run-2"
    payload = ex.ship(b"x" * 100, "weights")
    directory = tmp_path / "run-2"
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(directory / payload.name).st_mode) == 0o600
    exchange.drop_payloads()
    assert payload.read() == b"x" * 100
    ex.close()
    assert not directory.exists()


def test_one_function_decides_which_paths_are_local(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert local_path("/data/x") == "/data/x"
    assert local_path("data/x") == f"{tmp_path}/data/x"
    assert local_path("file:/data/x") == "/data/x"
    assert local_path("file:///data/x") == "/data/x"
    assert local_path("file://localhost/data/x") == "/data/x"
    assert local_path("FILE:///data/a%20b") == "/data/a b"
    assert local_path("file:data/x") == f"{tmp_path}/data/x"
    for remote in ("s3://bucket/x", "hdfs:///x", "hdfs:/x", "gs://b/x", "file://otherhost/x"):
        assert local_path(remote) is None, remote
    assert not Exchange("s3://bucket/x", "run-3").local
    # the executors' reader resolves every local spelling to the same file
    fs, path = resolve("file://localhost/data/x")
    assert type(fs).__name__ == "LocalFileSystem" and path == "/data/x"
