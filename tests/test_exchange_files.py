"""The exchange directory (Spark Connect's way to ship large weights; issue 22, acceptance 7):
files are verified against the hash they were shipped under, never trusted because of their
name, and private to the user on local paths."""

from __future__ import annotations

import os
import stat

import pytest

from sparkdl.errors import ExchangeError
from sparkdl.executor import exchange
from sparkdl.executor.exchange import Exchange


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


def test_exchange_files_are_private_on_local_paths(tmp_path):
    ex = Exchange(str(tmp_path), "run-2", limit=4)
    payload = ex.ship(b"x" * 100, "weights")
    directory = tmp_path / "run-2"
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(directory / payload.name).st_mode) == 0o600
    exchange.drop_payloads()
    assert payload.read() == b"x" * 100
    ex.close()
    assert not directory.exists()
