from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("default")

# Fast heartbeats so that tests can see a killed writer as dead within a fraction of a second.
FAST_HEARTBEAT = {"heartbeat.interval_s": 0.05, "heartbeat.tolerable_misses": 2}


@pytest.fixture
def fast_heartbeat() -> dict:
    return dict(FAST_HEARTBEAT)
