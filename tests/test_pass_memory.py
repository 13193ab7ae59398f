"""Issue 36, acceptance 7: a set of fits is split into passes that stay within the memory Spark's
settings give a pass, and a fit that alone exceeds a hard bound is refused before any job,
naming the setting (sparkdl.engine.strategies.sync.pass_memory)."""

from __future__ import annotations


import contextlib
import dataclasses
import logging

import pytest
import torch
from torch import nn

from models import JobCounter, classification_data, make_rdd
from sparkdl import DistriOptimizer, FitSet, InvalidArgumentError
from sparkdl.engine.strategies.sync.pass_memory import (Footprint, budgets, closure_budget,
                                                       plan_passes, spark_bytes)
from sparkdl.triggers import MaxIteration

SIZES = [30, 34]


def test_spark_sizes_are_read_in_each_settings_unit():
    assert spark_bytes("1g") == 1 << 30 and spark_bytes("512m") == 512 << 20
    assert spark_bytes("2048") == 2048 << 20              # spark.driver.memory: MiB
    assert spark_bytes("2048", "b") == 2048               # spark.driver.maxResultSize: bytes
    assert spark_bytes("3kb") == 3 << 10 and spark_bytes("0") == 0
    with pytest.raises(InvalidArgumentError, match="'lots'"):
        spark_bytes("lots")


def test_the_driver_job_bytes_setting_is_read_or_refused_by_name(sc):
    """spark.sparkdl.driverJobBytes: a size in bytes (units as Spark's), unset by default; a
    value that is not a size, or none above 0, is refused naming the setting, before any
    job."""
    from sparkdl.spark_settings import DRIVER_JOB_BYTES, driver_job_bytes_setting

    assert driver_job_bytes_setting("400m") == 400 << 20
    assert driver_job_bytes_setting("1048576") == 1 << 20          # a bare number: bytes
    assert driver_job_bytes_setting(None) is None and driver_job_bytes_setting(" ") is None
    with pytest.raises(InvalidArgumentError, match=r"cannot read the Spark size 'lots' of "
                                                   r"spark\.sparkdl\.driverJobBytes"):
        budgets({DRIVER_JOB_BYTES: "lots"}.get, "shuffle", 2)
    for zero in ("0", "0m", "-5"):
        with pytest.raises(InvalidArgumentError,
                           match=rf"spark\.sparkdl\.driverJobBytes='{zero}': the setting is "
                                 "the most bytes of task results one job may hand the driver"):
            driver_job_bytes_setting(zero)
    with pytest.raises(InvalidArgumentError, match="of spark.driver.memory"):
        budgets({"spark.driver.memory": "big"}.get, "shuffle", 2)
    refused_before_any_job(sc, DRIVER_JOB_BYTES,
                           [("lots", "'lots' of spark.sparkdl.driverJobBytes"),
                            ("0", "spark.sparkdl.driverJobBytes='0'")])


def test_a_jobs_share_of_the_drivers_heap_leaves_out_the_broadcast_pieces_it_holds(sc):
    """The driver's block store keeps the pieces of the weights it broadcasts (up to Spark's
    storage pool: (heap - 300 MiB) x spark.memory.fraction), and what it holds is not there for
    task results: a job hands the driver an eighth of the rest. On a cluster a 1 GiB model's
    pieces fill a 2 GiB driver's pool: 125 MiB a job, not 256 (150 M parameters with Adam in
    rounds ran such a driver out of heap at 256)."""
    from sparkdl.runners.driver_health import driver_job_share, max_result_bytes
    from sparkdl.spark_settings import storage_pool_bytes
    from sparkdl.transport.allreduce import driver_job_bytes

    heap = 2 << 30
    pool = storage_pool_bytes(heap)
    assert pool == int((2048 - 300) * 0.6 * 2**20)
    assert driver_job_bytes(heap, 1 << 30) == 256 << 20
    assert driver_job_bytes(heap, 1 << 30, held_bytes=pool) == (heap - pool) // 8
    assert round((heap - pool) / 8 / 2**20) == 125
    assert driver_job_bytes(heap, 1 << 30, chosen=300 << 20, held_bytes=pool) == 300 << 20
    # the running driver: its own heap, the pieces counted up to its pool
    jvm_heap = int(sc._jvm.java.lang.Runtime.getRuntime().maxMemory())
    results = max_result_bytes(sc)
    assert driver_job_share(sc) == driver_job_bytes(jvm_heap, results)
    assert driver_job_share(sc, 8 << 20) == driver_job_bytes(jvm_heap, results, None, 8 << 20)
    assert driver_job_share(sc, 1 << 40) == driver_job_bytes(jvm_heap, results, None,
                                                             storage_pool_bytes(jvm_heap))
    assert driver_job_share(sc, 1 << 40) < driver_job_share(sc)


def test_weights_above_a_cluster_jvms_block_store_pool_are_warned_of_before_any_job(caplog, sc):
    """On a cluster master the weights' broadcast pieces fill a JVM's block-store pool every
    iteration when the model is larger than it, and at Spark's spark.memory.fraction (0.6) the
    rest of the heap was too little for the records passing through (a 1.1 GiB model on 2g
    heaps); below 0.3's pool, on a local master (large values are files) or with a model
    within both pools, nothing is said."""
    from sparkdl.engine.strategies.sync.pass_memory import block_store_warning

    big = [Footprint(weights=1100 << 20, vector=1100 << 20, optimizer_state=0)]
    small = [Footprint(weights=200 << 20, vector=200 << 20, optimizer_state=0)]
    cluster = {"spark.master": "local-cluster[2,1,2048]", "spark.driver.memory": "2g",
               "spark.executor.memory": "2g"}
    reason = block_store_warning(cluster.get, big)
    assert reason is not None and "spark.memory.fraction=0.3" in reason
    assert "spark.driver.memory=2g" in reason and "(1049 MiB)" in reason   # (2048 - 300) x 0.6
    assert block_store_warning({**cluster, "spark.executor.memory": "8g",
                                "spark.driver.memory": "8g"}.get, big) is None
    assert "spark.executor.memory=1g" in block_store_warning(
        {**cluster, "spark.executor.memory": "1g", "spark.driver.memory": "8g"}.get, small * 3)
    assert block_store_warning(cluster.get, small) is None
    assert block_store_warning({**cluster, "spark.memory.fraction": "0.3"}.get, big) is None
    assert block_store_warning({**cluster, "spark.master": "local[2]"}.get, big) is None
    assert block_store_warning({}.get, big) is None


def test_budgets_follow_the_settings_as_spark_applies_them():
    settings = {"spark.driver.maxResultSize": "10m", "spark.driver.memory": "2g",
                "spark.executor.pyspark.memory": "3g", "spark.executor.cores": "3"}
    by_name = {b.setting: b for b in budgets(settings.get, "driver", 4)}
    assert by_name["spark.driver.maxResultSize"].bytes == 10 << 20
    assert by_name["spark.driver.memory"].bytes == (2 << 30) // 8
    assert by_name["spark.executor.pyspark.memory"].bytes == 1 << 30   # per worker: / cores
    fp = Footprint(weights=1 << 20, vector=1 << 20, optimizer_state=0)
    # the driver path takes in every partition's vector; the shuffle path the reduced blocks
    assert by_name["spark.driver.maxResultSize"].needs([fp, fp]) == int(1.05 * 8 * (1 << 20))
    shuffle = {b.setting: b for b in budgets(settings.get, "shuffle", 4)}
    assert shuffle["spark.driver.maxResultSize"].needs([fp, fp]) == 2 << 20
    # a vector above a job's share (half of maxResultSize here) reaches the driver in jobs of it
    big = Footprint(weights=40 << 20, vector=40 << 20, optimizer_state=0)
    assert shuffle["spark.driver.maxResultSize"].needs([big]) == 5 << 20
    assert by_name["spark.executor.pyspark.memory"].needs([fp]) == 5 << 20
    # the defaults: maxResultSize 1g, driver memory 1g, no Python limit; 0 lifts maxResultSize
    assert {b.setting for b in budgets({}.get, "auto", 2)} == {"spark.driver.maxResultSize",
                                                                "spark.driver.memory"}
    assert [b.setting for b in budgets({"spark.driver.maxResultSize": "0"}.get, "auto", 2)] == [
        "spark.driver.memory", "spark.driver.memory"]     # broadcast pieces, results per job


def test_a_connect_pass_keeps_its_functions_within_the_closure_limit(caplog):
    """Under Spark Connect a job's function carries each fit's model and weights (about twice
    its weights) unless they travel as files: passes stay within 16 MiB of them."""
    mib = 1 << 20
    fits = [Footprint(3 * mib, 3 * mib, 0) for _ in range(4)]       # 6 MiB inline each
    without = closure_budget(None)
    assert (without.setting, without.value, without.bytes) == ("exchangeDir", "unset", 16 * mib)
    with caplog.at_level(logging.INFO, logger="sparkdl"):
        assert plan_passes([0, 1, 2, 3], fits, [without]) == [[0, 1], [2, 3]]
    assert "exchangeDir=unset" in caplog.text
    # with a directory, weights above 2 MiB travel as files: nothing large stays inline
    assert plan_passes([0, 1, 2, 3], fits, [closure_budget("/shared/x")]) == [[0, 1, 2, 3]]
    small = [Footprint(mib, mib, 0) for _ in range(10)]                # inline either way
    assert plan_passes(list(range(10)), small, [closure_budget("/shared/x")]) == [
        list(range(8)), [8, 9]]


def test_passes_are_cut_where_a_budget_would_be_exceeded(caplog):
    limits = budgets({"spark.executor.pyspark.memory": "100m"}.get, "shuffle", 2)
    fits = [Footprint(10 << 20, 5 << 20, 0)] * 5        # 35 MiB each in a worker
    assert plan_passes([0, 1, 2, 3, 4], fits, limits) == [[0, 1], [2, 3], [4]]
    big = Footprint(30 << 20, 20 << 20, 0)              # 120 MiB alone
    with pytest.raises(InvalidArgumentError) as err:
        plan_passes([0, 7], [fits[0], big], limits)
    assert "fit 7 cannot train within spark.executor.pyspark.memory=100m" in str(err.value)
    assert "120.0 MiB" in str(err.value) and "nothing has run yet" in str(err.value)
    # in local rounds a task also holds its partition's optimizer state, twice (the
    # optimizer's own and the state file's): a 40 MiB Adam state makes 35 MiB into 115 MiB
    adam = Footprint(10 << 20, 5 << 20, 40 << 20)
    assert plan_passes([0], [adam], limits) == [[0]]
    with pytest.raises(InvalidArgumentError, match="115.0 MiB"):
        plan_passes([0], [dataclasses.replace(adam, rounds=True)], limits)
    # the driver's heap (80m: 10 MiB per job) bounds the driver path, hard: a fit whose every
    # partition's vector exceeds it is refused, naming the setting and the shuffle path
    heap = budgets({"spark.driver.memory": "80m"}.get, "driver", 2)
    with pytest.raises(InvalidArgumentError) as err:
        plan_passes([0, 1], [Footprint(0, 4 << 20, 0), Footprint(0, 12 << 20, 0)], heap)
    assert "fit 1 cannot train within spark.driver.memory=80m" in str(err.value)
    assert "25.2 MiB" in str(err.value) and 'allreduce="shuffle"' in str(err.value)
    # on the shuffle path the sums reach the driver in jobs within it: no pass is split for it
    shuffle = budgets({"spark.driver.memory": "80m"}.get, "shuffle", 2)
    fits3 = [Footprint(0, 4 << 20, 0), Footprint(0, 12 << 20, 0), Footprint(0, 40 << 20, 0)]
    assert plan_passes([0, 1, 2], fits3, shuffle) == [[0, 1, 2]]
    assert {b.setting: b.needs(fits3) for b in shuffle}["spark.driver.memory"] <= 10 << 20
    # auto takes the shuffle path where the driver path would exceed a job's share
    assert plan_passes([0, 1], fits3[:2], budgets({"spark.driver.memory": "80m"}.get, "auto",
                                                  2)) == [[0, 1]]


def test_a_record_budget_a_heap_cannot_hold_is_refused_before_any_job(sc):
    """spark.sparkdl.maxRecordBytes (32m by default) bounds every record, task result and
    broadcast piece crossing a JVM, so what a JVM holds follows it, never the model: each task
    an executor runs at once holds its largest record about three times, the driver a piece
    as it seeds it. A fit whose records the executors' heaps (beyond Spark's reserved 300 MiB)
    or the driver's cannot hold is refused before any job, naming the heap's setting and the
    budget; so is a driver-path fit whose whole vector, a task's result there, the executors
    cannot hold. A small model trains whatever the budget; a budget under 1 MiB is refused."""
    from sparkdl.spark_settings import MAX_RECORD_BYTES, max_record_bytes_setting

    mib = 1 << 20
    assert max_record_bytes_setting(None) == 32 * mib
    assert max_record_bytes_setting("1048576") == mib           # a bare number: bytes
    for zero in ("0", "-5"):
        with pytest.raises(InvalidArgumentError,
                           match=rf"spark\.sparkdl\.maxRecordBytes='{zero}': the setting is "
                                 "the most bytes of a vector one shuffle record"):
            max_record_bytes_setting(zero)
    with pytest.raises(InvalidArgumentError, match=r"maxRecordBytes='16': .* below 1 MiB .* "
                                                   r"\(a bare number is bytes"):
        max_record_bytes_setting("16")
    cluster = {"spark.master": "local-cluster[2,1,512]", "spark.executor.memory": "512m",
               "spark.driver.memory": "2g"}
    by_name = {b.setting: b for b in budgets({**cluster, "spark.driver.memory": "512m"}.get,
                                             "shuffle", 2)}
    executor = by_name["spark.executor.memory"]
    assert executor.bytes == 212 * mib                          # 512m less the reserved 300
    model = Footprint(weights=192 * mib, vector=192 * mib, optimizer_state=0)
    assert executor.needs([model]) == 3 * 32 * mib              # the model's size aside
    assert executor.needs([model] * 8) == 3 * 32 * mib
    assert plan_passes([0], [model], list(by_name.values())) == [[0]]
    # what a budget asks of a heap follows the records a pass makes: a small model's records
    # are small whatever the budget, so only a model whose records the heaps cannot hold is
    # refused (before any job, naming the heap's setting and the record budget)
    small = Footprint(weights=mib, vector=mib, optimizer_state=0)
    for settings, fit, message in [
            ({**cluster, MAX_RECORD_BYTES: "80m"}, model,
             r"^fit 0 cannot train within spark\.executor\.memory=512m: it needs about 240\.0 "
             r"MiB of records and task results in an executor's JVM \(1 task\(s\) at once, .*"
             r"the setting allows 212\.0 MiB .* Raise spark\.executor\.memory, or lower "
             r"spark\.sparkdl\.maxRecordBytes or train a smaller model; nothing has run yet"),
            ({**cluster, "spark.master": "local-cluster[2,2,1024]", MAX_RECORD_BYTES: "40m",
              "spark.executor.memory": "512m"}, model,
             r"spark\.executor\.memory=512m: it needs about 240\.0 MiB .* \(2 task\(s\) at once"),
            ({**cluster, "spark.master": "spark://h:7077", "spark.executor.cores": "4"}, model,
             r"spark\.executor\.memory=512m: it needs about 384\.0 MiB .* \(4 task\(s\) at once"),
            ({"spark.master": "local[2]", "spark.driver.memory": "512m",
              MAX_RECORD_BYTES: "80m"}, model,
             r"^fit 0 cannot train within spark\.driver\.memory=512m: it needs about 240\.0 MiB "
             r"of broadcast pieces the driver seeds .* or lower spark\.sparkdl\.maxRecordBytes")]:
        limits = budgets(settings.get, "shuffle", 2)
        with pytest.raises(InvalidArgumentError, match=message):
            plan_passes([0], [fit], limits)
        assert plan_passes([0], [small], limits) == [[0]]     # the same settings, a small model
    # one task at a time on two cores, each of 4 CPUs: the same 40m records fit
    assert plan_passes([0], [model], budgets(
        {**cluster, "spark.master": "local-cluster[2,2,1024]", MAX_RECORD_BYTES: "40m",
         "spark.executor.memory": "512m", "spark.task.cpus": "2"}.get, "shuffle", 2)) == [[0]]
    # eight cores of 1g executors at the default budget: a small model trains, a 192 MiB one
    # (eight tasks at once, each holding a 32 MiB block three times) does not
    eight = {"spark.master": "spark://h:7077", "spark.executor.cores": "8",
             "spark.executor.memory": "1g"}
    assert plan_passes([0], [small], budgets(eight.get, "shuffle", 2)) == [[0]]
    with pytest.raises(InvalidArgumentError, match=r"768\.0 MiB of records"):
        plan_passes([0], [model], budgets(eight.get, "shuffle", 2))
    # on the driver path a task's result is its whole vector
    driver = budgets({**cluster, "spark.driver.memory": "4g"}.get, "driver", 2)
    with pytest.raises(InvalidArgumentError) as err:
        plan_passes([0], [Footprint(0, 80 * mib, 0)], driver)
    assert "fit 0 cannot train within spark.executor.memory=512m" in str(err.value)
    assert "240.0 MiB of records and task results in an executor's JVM" in str(err.value)
    assert 'allreduce="shuffle"' in str(err.value)
    # a fit on the session's local[2]: a setting that is no size refused before any job
    refused_before_any_job(sc, MAX_RECORD_BYTES,
                           [("lots", "'lots' of spark.sparkdl.maxRecordBytes"),
                            ("16", "below 1 MiB")])


class Wide(nn.Module):
    """An MLP whose gradient vector is ``hidden`` x 48 floats and a little more."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 32),
                                 nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


def make_fit(rdd, hidden: int, lr: float) -> DistriOptimizer:
    torch.manual_seed(1)
    model = Wide(hidden)
    return DistriOptimizer(model, rdd, nn.CrossEntropyLoss(),
                           torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                           batch_size=16, end_trigger=MaxIteration(3), seed=2,
                           progress_bar=False, allreduce="driver")


def refused_before_any_job(sc, key: str, cases: list[tuple[str, str]]) -> None:
    """A fit on ``sc`` with each ``(value, message)`` of the setting ``key`` is refused with
    an error matching ``message``, and no job runs."""
    x, y = classification_data(sum(SIZES), d=16, classes=4, seed=4)
    rdd = make_rdd(sc, list(zip(x, y)), SIZES)
    for value, message in cases:
        with live_setting(sc, key, value), JobCounter(sc) as jobs:
            with pytest.raises(InvalidArgumentError, match=message):
                make_fit(rdd, 8, 0.1).optimize()
        assert jobs.count == 0


@contextlib.contextmanager
def live_setting(sc, key: str, value: str):
    """``key`` set on the running context's own conf (Spark reads maxResultSize from it when a
    job's task set starts), put back afterwards."""
    conf = sc._jsc.sc().conf()
    before = conf.getOption(key)
    conf.set(key, value)
    try:
        yield
    finally:
        if before.isDefined():
            conf.set(key, before.get())
        else:
            conf.remove(key)


def test_a_grid_above_max_result_size_is_split_and_a_fit_above_it_alone_refused(
        sc, caplog, monkeypatch):
    """spark.driver.maxResultSize=1m on the driver AllReduce path over 2 partitions: a fit of
    ~0.41 MiB per vector takes in ~0.86 MiB per job, two together ~1.7 MiB, which Spark
    refuses. The grid of three trains in three passes, each fit bitwise its own fit alone; a
    fit of ~0.66 MiB (1.4 MiB taken in) is refused before any job, naming the setting."""
    from sparkdl.engine import fit_set as fit_set_module
    x, y = classification_data(sum(SIZES), d=16, classes=4, seed=4)
    rdd = make_rdd(sc, list(zip(x, y)), SIZES)
    hidden = 2200                                    # 2200 x 48 + 2200 + 132 floats: 0.41 MiB
    with live_setting(sc, "spark.driver.maxResultSize", "1m"):
        fits = [make_fit(rdd, hidden, lr) for lr in (0.1, 0.05, 0.02)]
        fit_set = FitSet(fits)
        with caplog.at_level(logging.INFO, "sparkdl"):
            fit_set.run()
        assert fit_set.passes == [[0], [1], [2]]
        assert "train in 3 passes, [[0], [1], [2]], to stay within" in caplog.text
        assert "spark.driver.maxResultSize=1m" in caplog.text
        for fit, lr in zip(fits, (0.1, 0.05, 0.02)):
            alone = make_fit(rdd, hidden, lr)
            alone.optimize()
            assert all(torch.equal(a, b) for a, b in zip(fit.model.state_dict().values(),
                                                         alone.model.state_dict().values()))
        # the split is needed: the same two fits in one pass make Spark abort the job
        monkeypatch.setattr(fit_set_module, "plan_passes", lambda group, fits, limits: [list(group)])
        with pytest.raises(Exception, match="bigger than spark.driver.maxResultSize"):
            FitSet([make_fit(rdd, hidden, lr) for lr in (0.1, 0.05)]).run()
        monkeypatch.undo()
        too_big = [make_fit(rdd, hidden, 0.1), make_fit(rdd, 3500, 0.1)]
        with JobCounter(sc) as jobs:
            with pytest.raises(InvalidArgumentError) as err:
                FitSet(too_big).run()
        assert jobs.count == 0
    assert "fit 1 cannot train within spark.driver.maxResultSize=1m" in str(err.value)
