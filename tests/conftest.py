from __future__ import annotations

import os
import sys
import uuid

import pytest
from hypothesis import HealthCheck, settings

from devtools import local_s3

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Every JVM the run starts (its Spark session, child processes' sessions, the standalone cluster's daemons and
# executors, the benchmarks' tiny runs) does seconds of work, most of it starting: C2's compilations and G1's
# threads were a third of its CPU. A session started and one job run took 27 core-seconds, 17 so; the file
# test_spark_source.py 86 s and 126 core-seconds, 68 s and 82 (docs/design-notes.md, "The suite's time").
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                            HealthCheck.function_scoped_fixture])
settings.load_profile("default")

# Fast heartbeats so that tests can see a killed writer as dead within a fraction of a second; on an object
# store, a lock whose holder was killed is free again after its lease (a file lock at once).
FAST_HEARTBEAT = {"heartbeat.interval_s": 0.05, "heartbeat.tolerable_misses": 2, "lock.lease_s": 2.0}
BUCKET = "tests"
STORAGES = ["local", "s3"]


@pytest.fixture(scope="session")
def rgw():
    """A real S3 server for the run: Ceph's RADOS Gateway on 127.0.0.1 (`devtools.local_s3`, ~15 s to start on
    first use), with a bucket `tests`. Its endpoint and credentials go into this process's environment
    (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, ...), which the child processes tests start inherit."""
    server = local_s3.start()
    saved = {name: os.environ.get(name) for name in server.environment}
    try:
        server.create_bucket(BUCKET)
        os.environ.update(server.environment)
        yield server
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        server.stop()


class Lake:
    """Where a test makes its tables: `lake / "t"` is a table path under a temporary directory, or under a
    fresh prefix of the test bucket."""

    def __init__(self, root: str) -> None:
        self.root = root

    @property
    def remote(self) -> bool:
        return self.root.startswith("s3://")

    def __truediv__(self, name: str) -> str:
        return f"{self.root}/{name}"


@pytest.fixture(params=STORAGES)
def lake(request, tmp_path) -> Lake:
    """Tables on both storages: a test that takes `lake` runs once on local files, once on the RGW."""
    if request.param == "local":
        return Lake(str(tmp_path))
    request.getfixturevalue("rgw")
    name = "".join(c if c.isalnum() or c in "_-" else "-" for c in request.node.name)[:60]
    return Lake(f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def fast_heartbeat() -> dict:
    return dict(FAST_HEARTBEAT)


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for all the tests of this process (a JVM start costs seconds; `make test` runs two
    workers, each with its own)."""
    import metatable as mt

    session = mt.spark_session(master="local[2]", shuffle_partitions=2,
                               **{"spark.ui.showConsoleProgress": "false"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
