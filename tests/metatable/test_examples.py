"""The scripts in `examples/` run as they stand and end equal to their own models."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_the_orders_workflow_runs_end_to_end(tmp_path):
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, os.path.join(ROOT_DIR, "examples", "orders.py"), "--orders", "2000",
                           "--workdir", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for step in ("merge 3:", "DuckDB:", "Polars:", "Spark SQL:", "stream: 3 change files applied",
                 "equal to the model"):
        assert step in done.stdout, done.stdout
