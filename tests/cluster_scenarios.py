"""Several of cluster_job.py's runs (scenarios) in sequence in one driver process and one
SparkContext: starting a driver and its executors costs JVM startups (15-20 s on two cores), a
scenario only its fit.

    python cluster_scenarios.py MASTER NAME "OUT.pt [cluster_job.py's options]" [NAME "..." ...]

The scenarios must agree on :data:`cluster_job.SESSION_SETTINGS` (the SparkContext's
configuration); group scenarios by them. Each scenario's output is its own section of stdout
and of stderr, between a :data:`BEGIN` and an :data:`END` line that name it (read one with
:func:`section`); a scenario that raises ends its section ``failed`` with its traceback, and the
next one still runs. Before each scenario the runner waits until every executor of a
local-cluster master has registered: an executor an earlier scenario killed is relaunched by its
worker.
"""

from __future__ import annotations

import os
import shlex
import sys
import traceback
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cluster_job  # noqa: E402

BEGIN = "=== scenario {name} begins ==="
END = "=== scenario {name} ends: {status} ==="


@dataclass
class Section:
    """One scenario's lines of a run's stdout and stderr, and how it ended ("ok", "failed")."""

    stdout: str
    stderr: str
    status: str


def parse_scenarios(master: str, pairs: list[tuple[str, str]]):
    """``[(name, args)]`` from ``(NAME, "OUT.pt [options]")`` pairs, each parsed by
    cluster_job's parser with ``master``; a ValueError names a repeated or malformed name, or
    the scenario and setting that differ from the first scenario's session."""
    parsed, p = [], cluster_job.parser()
    for name, options in pairs:
        if not name or any(c.isspace() for c in name) or name in (n for n, _ in parsed):
            raise ValueError(f"scenario name {name!r}: names must be unique, without spaces")
        parsed.append((name, p.parse_args([master, *shlex.split(options)])))
    first_name, first = parsed[0]
    for name, args in parsed[1:]:
        for setting in cluster_job.SESSION_SETTINGS:
            if getattr(args, setting) != getattr(first, setting):
                raise ValueError(
                    f"scenario {name!r} has {setting}={getattr(args, setting)!r}, scenario "
                    f"{first_name!r} {getattr(first, setting)!r}: scenarios of one driver "
                    "process share its SparkContext's settings; run them in separate jobs")
    return parsed


def mark(line: str) -> None:
    """``line`` on stdout and on stderr, after everything written before it."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
        print(line, file=stream, flush=True)


def section(stdout: str, stderr: str, name: str) -> Section:
    """Scenario ``name``'s section of a run's output; a ValueError if it is not there exactly
    once in both streams, or has not ended (its driver died in it)."""
    begin = BEGIN.format(name=name)
    parts, status = [], None
    for text in (stdout, stderr):
        lines = text.splitlines()
        if lines.count(begin) != 1:
            raise ValueError(f"scenario {name!r} began {lines.count(begin)} times in the output")
        start = lines.index(begin) + 1
        ends = [i for i in range(start, len(lines))
                if lines[i].startswith(f"=== scenario {name} ends: ")]
        if not ends:
            raise ValueError(f"scenario {name!r} did not end")
        status = lines[ends[0]][len(f"=== scenario {name} ends: "):-len(" ===")]
        parts.append("\n".join(lines[start:ends[0]]))
    return Section(parts[0], parts[1], status)


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) < 3 or len(argv) % 2 == 0:
        raise SystemExit(__doc__)
    master = argv[0]
    scenarios = parse_scenarios(master, list(zip(argv[1::2], argv[2::2])))
    spark = cluster_job.start_session(scenarios[0][1])
    executors = cluster_job.local_cluster_executors(master)
    for name, args in scenarios:
        if executors:
            cluster_job.wait_for_executors(spark.sparkContext, executors)
        mark(BEGIN.format(name=name))
        try:
            cluster_job.run(spark, args)
            status = "ok"
        except Exception:  # reported in its section; the next scenario still runs
            traceback.print_exc()
            status = "failed"
        mark(END.format(name=name, status=status))
    spark.stop()


if __name__ == "__main__":
    main()
