"""The Spark pipeline on a real standalone cluster: a master and two 1-core workers started from the pyspark
installation's own launcher, on loopback. Executors run in their own JVMs and Python processes, so nothing
may rely on the driver's memory. Every table the steps write equals the rows expected, computed apart from
Spark. (The same steps in local mode, compared with the cluster's, cost ~34 s of the suite, 119 -> 85 s, and
were dropped in stop 59: each step on a local session is tested against a model or an in-process run in
`test_table_spark`, `test_indexer` and `test_reads_api`.)"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pyspark
import pytest

import metatable as mt
from metatable.demo import generate_lineitem

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY = ["l_orderkey", "l_linenumber"]
SCALE_FACTOR = 0.05


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, log: str, seconds: float = 180) -> None:
    """Until the master listens (a busy machine's fresh-clone run saw none in 60 s): else its log's end."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    with open(log) as f:
        raise TimeoutError(f"nothing listens on port {port} after {seconds:.0f} s; the end of {log}:\n{f.read()[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """`spark-class ...Master` and two `...Worker` (1 core each); stopped at the end of the module."""
    home = os.path.dirname(pyspark.__file__)
    logs = tmp_path_factory.mktemp("cluster")
    env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOG_DIR": str(logs), "SPARK_WORKER_DIR": str(logs / "work")}
    port = free_port()
    launcher = os.path.join(home, "bin", "spark-class")
    master = [launcher, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(free_port())]
    processes = [subprocess.Popen(master, env=env, stdout=open(logs / "master.log", "w"), stderr=subprocess.STDOUT)]
    try:
        wait_for_port(port, str(logs / "master.log"))
        for n in range(2):
            worker = [launcher, "org.apache.spark.deploy.worker.Worker", "--cores", "1", "--memory", "1g",
                      "--host", "127.0.0.1", "--webui-port", str(free_port()), f"spark://127.0.0.1:{port}"]
            processes.append(subprocess.Popen(worker, env=env, stdout=open(logs / f"worker{n}.log", "w"),
                                              stderr=subprocess.STDOUT))
        yield f"spark://127.0.0.1:{port}"
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """lineitem at SF 0.05 with its ship year; a 5% upsert (90% updates, 10% new keys); 1,000 deletes; and
    the rows expected after the three."""
    out = tmp_path_factory.mktemp("data")
    raw = pq.read_table(generate_lineitem(str(out), SCALE_FACTOR))
    raw = raw.cast(pa.schema([pa.field(f.name, pa.string() if f.type == pa.string_view() else f.type)
                              for f in raw.schema]))
    load = raw.append_column("ship_year", pc.year(raw["l_shipdate"]).cast(pa.int32()))
    n = load.num_rows // 20
    updates = load.slice(0, n * 9 // 10)
    updates = updates.set_column(updates.schema.get_field_index("l_comment"), "l_comment",
                                 pa.array(["updated"] * updates.num_rows))
    new = load.slice(n, n // 10)
    new = new.set_column(0, "l_orderkey", pc.add(new["l_orderkey"], 10**9))
    upsert = pa.concat_tables([updates, new])
    doomed = load.slice(load.num_rows - 1000, 1000).select([*KEY, "ship_year"])
    for name, table in (("load", load), ("upsert", upsert), ("delete", doomed)):
        pq.write_table(table, out / f"{name}.parquet")
    kept = pc.invert(pc.is_in(key(load), pa.concat_arrays([key(upsert), key(doomed)])))
    expected = pa.concat_tables([load.filter(kept), upsert.filter(pc.invert(pc.is_in(key(upsert), key(doomed))))])
    return out, expected.sort_by([(c, "ascending") for c in KEY]), (load.num_rows, updates.num_rows, new.num_rows)


def key(table: pa.Table) -> pa.Array:
    """(l_orderkey, l_linenumber) as one integer: line numbers are 1..7."""
    return pc.add(pc.multiply(table["l_orderkey"], 8), table["l_linenumber"]).combine_chunks()


def run_steps(master: str, root: str, data_dir, *args: str, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.metatable.cluster_child", master, root, str(data_dir), *args],
                          cwd=ROOT_DIR, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": ROOT_DIR, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def table_rows(root: str) -> pa.Table:
    return mt.Table.open(root).to_arrow().sort_by([(c, "ascending") for c in KEY])


@pytest.mark.slow
@pytest.mark.parametrize("lake", ["s3"], indirect=True)
def test_the_pipeline_on_a_standalone_cluster_equals_the_expected_rows(cluster, data, lake):
    """The cluster writes `s3://` tables on the RGW (workers started without its credentials, stock pyspark
    without Hadoop's S3 connector: the executors reach the bucket through the storage the driver hands them).
    Every step's count and every table equal what is expected. (A second cluster run on local files cost 75 s
    of the suite: what the cluster adds is the storage the executors reach, and the RGW is the harder one.)"""
    data_dir, expected, (loaded, updated, inserted) = data
    on_cluster = run_steps(cluster, lake / "cluster", data_dir)
    assert on_cluster["driver"] not in on_cluster["executors"], "executors' Python is not the driver's"
    assert len(on_cluster["executors"]) >= 2 and on_cluster["shipped"] == [], "the workers have the project"
    assert mt.Table.open(lake / "cluster").indexes()["record_index"] == "ready"
    steps = on_cluster["steps"]
    assert steps["load"] == loaded and steps["upsert"] == [inserted, updated] and steps["delete"] == 1000
    assert steps["read"] == expected.num_rows and steps["compact"] and steps["cluster"] and steps["index"] == 1
    assert steps["source_read"] == pc.sum(pc.equal(expected["ship_year"], 1995)).as_py()
    assert steps["bloom_upsert"] == [inserted, updated] and steps["bloom_delete"] == 1000
    assert steps["resize"] and steps["ring_delete"] == 1000
    for root in (lake / name for name in ("cluster", "cluster-bloom", "cluster-ch")):
        got = table_rows(root)
        assert got.equals(expected.select(got.column_names).cast(got.schema)), root


@pytest.mark.slow
def test_executors_that_cannot_import_the_project_get_it_shipped(cluster, data, tmp_path):
    """Executors whose Python lacks the project (site-packages on the path, but not the editable install's
    .pth): the session ships the packages, and a write and a read run there."""
    python = tmp_path / "python-without-metatable"
    site = sysconfig.get_paths()["purelib"]
    python.write_text(f'#!/bin/sh\nPYTHONPATH="$PYTHONPATH:{site}" exec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    assert subprocess.run([str(python), "-c", "import metatable"], cwd=tmp_path, capture_output=True).returncode != 0
    assert subprocess.run([str(python), "-c", "import pyarrow"], cwd=tmp_path).returncode == 0
    data_dir, _, (_, updated, inserted) = data
    done = run_steps(cluster, str(tmp_path / "t"), data_dir, "small", PYSPARK_PYTHON=str(python))
    assert done["shipped"] == ["metatable-packages.zip"]
    assert done["steps"] == {"load": updated + inserted, "read": updated + inserted}
