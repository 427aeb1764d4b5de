from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                            HealthCheck.function_scoped_fixture])
settings.load_profile("default")

# Fast heartbeats so that tests can see a killed writer as dead within a fraction of a second.
FAST_HEARTBEAT = {"heartbeat.interval_s": 0.05, "heartbeat.tolerable_misses": 2}


@pytest.fixture
def fast_heartbeat() -> dict:
    return dict(FAST_HEARTBEAT)


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for the whole test run (a JVM start costs seconds)."""
    import metatable as mt

    session = mt.spark_session(master="local[2]", shuffle_partitions=2,
                               **{"spark.ui.showConsoleProgress": "false"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
