"""Every benchmark in `benchmarks/` runs to its end at a tiny scale, its own checks passing.

The benchmarks verify what they measure (counts, rows read back, lookups found) and exit non-zero when a
check fails; nothing here looks at their times. A benchmark that nobody runs stops working unnoticed: one
called a function with an argument it no longer took, two sampled more keys than a small table has.

They run two at a time, each in a work directory of its own that shares one generated TPC-H directory: one
at a time they took 326 s of the suite and left part of the second core idle; two at a time, 263 + 11 s.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from metatable.demo import generate_lineitem

ROOT = Path(__file__).resolve().parent.parent
SF = "0.01"
PEERS = ["delta", "inproc-mor-bucket", "inproc-mor-ch", "spark-mor-bucket"]

# (script, arguments besides the work directory); Spark-based ones start a JVM of their own
BENCHMARKS = [
    ("mdt_lookup.py", ["--keys", "20000", "--lookups", "2000", "--logs", "2", "--log-records", "1000"]),
    ("log_blocks.py", ["--rows", "500", "--scale-factor", SF, "--repeat", "1"]),
    ("bulk_load.py", ["--scale-factors", SF]),
    ("lookup.py", ["--scale-factor", SF, "--buckets", "2"]),
    ("clustering.py", ["--scale-factor", SF, "--commits", "5"]),
    ("resize.py", ["--scale-factor", SF, "--target-mb", "0.5"]),
    ("indexer.py", ["--scale-factor", SF, "--rounds", "1"]),
    ("upsert.py", ["--scale-factor", SF, "--buckets", "2", "--only", "metatable,delta", "--indexes", "bucket"]),
    ("changes.py", ["--scale-factors", SF]),
    ("secondary_index.py", ["--scale-factor", SF, "--queries", "5", "--scan-queries", "2", "--buckets", "1"]),
    ("long_life.py", ["--commits", "120", "--every", "60", "--rows", "2000"]),  # archives: 60 instants by default
    ("long_life.py", ["--stream-seconds", "8", "--every-seconds", "4", "--rows", "2000"]),
    ("workload.py", ["--rows", "20000", "--days", "6", "--batches", "2", "--updates", "500", "--inserts", "200",
                     "--deletes", "50"]),
]
IDS = [b[0].removesuffix(".py") + ("-stream" if "--stream-seconds" in b[1] else "") for b in BENCHMARKS]
# the longest first (seconds one at a time, stop 58), so that the last to finish is a short one
LONGEST_FIRST = ["peers", "indexer", "lookup", "upsert", "long_life", "bulk_load", "long_life-stream", "clustering"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The work directories' parent; the generated TPC-H data is made once, in `shared`."""
    base = tmp_path_factory.mktemp("bench-data")
    generate_lineitem(str(base / "shared"), float(SF))
    return base


def own_workdir(base: Path, name: str) -> Path:
    """A work directory of `name`'s own, with the shared TPC-H data linked in (two benchmarks at a time must not
    write each other's tables)."""
    path = base / name
    path.mkdir()
    for data in (base / "shared").iterdir():
        (path / data.name).symlink_to(data, target_is_directory=True)
    return path


@pytest.fixture(scope="module")
def runs(workdir: Path, request):
    """The finished process of every benchmark the run selected, by test id, started two at a time when the
    first test asks."""
    commands = {"peers": [sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--scale-factor", SF,
                          "--systems", ",".join(PEERS)]}
    for name, (script, args) in zip(IDS, BENCHMARKS):
        commands[name] = [sys.executable, str(ROOT / "benchmarks" / script), *args]
    mine = [item for item in request.session.items if item.module is sys.modules[__name__]]
    selected = {item.callspec.id for item in mine if item.originalname == "test_benchmark_runs_and_its_checks_pass"}
    selected |= {"peers" for item in mine if item.originalname == "test_peers_reports_every_step_of_every_system"}
    commands = {name: command for name, command in commands.items() if name in selected}
    for name, command in commands.items():
        if name != "mdt_lookup":  # the one that makes its data in a temporary directory of its own
            command += ["--workdir", str(own_workdir(workdir, name))]

    def run(command: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT,
                              env={**os.environ, "PYSPARK_PYTHON": sys.executable})

    order = sorted(commands, key=lambda n: LONGEST_FIRST.index(n) if n in LONGEST_FIRST else len(LONGEST_FIRST))
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures: dict[str, Future] = {name: pool.submit(run, commands[name]) for name in order}
        yield futures


@pytest.mark.slow
@pytest.mark.parametrize("script,args", BENCHMARKS, ids=IDS)
def test_benchmark_runs_and_its_checks_pass(script: str, args: list[str], runs, request) -> None:
    done = runs[request.node.callspec.id].result()
    assert done.returncode == 0, f"{script} exited with {done.returncode}:\n{done.stderr[-3000:]}"
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    name = script.removesuffix(".py")
    assert lines and all(line["benchmark"] == name for line in lines), done.stdout[-2000:]
    measured = [line for line in lines if "seconds" in line or "us_per_key" in line or "read_us_per_row" in line]
    assert measured, f"{script} printed no measurement:\n{done.stdout[-2000:]}"


@pytest.mark.slow
def test_peers_reports_every_step_of_every_system(runs) -> None:
    """The issue-12 benchmark, in-process and on Spark: each system's four steps, each with a ratio to
    delta-rs's."""
    done = runs["peers"].result()
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    steps = {(line["system"], line["step"]) for line in lines if "seconds" in line}
    expected_steps = ["bulk_load", "upsert", "upsert_skewed", "get_1000"]
    assert steps == {(s, step) for s in PEERS for step in expected_steps}
    ratios = {line["step"] for line in lines if line.get("ratio") == "delta/metatable seconds"}
    assert ratios == set(expected_steps)
    in_process = [line for line in lines if "start_rss_mb" in line]  # the writes (a get runs in a process of its own)
    assert len(in_process) == 3 * len(PEERS)
    assert all(line["start_rss_mb"] <= line["peak_rss_mb"] for line in in_process)


@pytest.mark.slow
def test_the_object_store_benchmark_runs_on_the_test_runs_rgw(rgw, workdir: Path) -> None:
    """`object_store.py` on the run's RGW (its AWS_* settings are in the environment), both systems, every
    step with its requests counted."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "object_store.py"), "--scale-factors", SF,
                           "--workdir", str(own_workdir(workdir, "object_store"))],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    steps = {(line["system"], line["step"]) for line in lines if "seconds" in line}
    shared = ["bulk_load", "open", "upsert", "upsert_1000", "delete", "get_1000", "filtered_read", "compaction",
              "clustering"]
    assert steps == {(s, step) for s in ("metatable", "delta") for step in shared} | {
        ("metatable", "lookup_1000"), ("metatable", "upsert_1000_warm"), ("metatable", "upsert_1000_fresh_process"),
        ("metatable", "get_1000_fresh_process")}
    assert all(line["total_requests"] > 0 for line in lines if "seconds" in line and line["step"] != "lookup_1000")
    assert {line["target"] for line in lines if "target" in line} == {
        "upsert >= 3x faster than delta-rs", "1,000-row upsert <= 30 requests (record index unread)",
        "1,000-row upsert <= 30 requests (record index read)",
        "1,000-row upsert <= 30 requests (a new process, open included)",
        "warm lookup <= 1 request per metadata file group, no LIST"}
    by_step = {line["step"]: line for line in lines if line.get("system") == "metatable" and "seconds" in line}
    # the writer that has read its record index asks it, and reads no base file for the keys
    assert "GET_RANGE" not in by_step["upsert_1000_warm"]["requests"]
