"""The README's Python tour and shell session run as they stand: each line, pasted into Python or a shell,
succeeds."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_block(after: str, language: str) -> str:
    """The first ```language block of the README after the text `after`."""
    text = open(os.path.join(ROOT_DIR, "README.md")).read()
    return re.search(rf"```{language}\n(.*?)```", text[text.index(after):], re.S).group(1)


@pytest.mark.slow
def test_the_readme_shell_session_runs_as_it_stands(tmp_path):
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           "TMPDIR": str(tmp_path), "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(["bash", "-e", "-x", "-c", readme_block("From the shell", "sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(5 rows)" in done.stderr and "rebuilt the metadata table" in done.stdout
    assert "0 inserted, 100 updated" in done.stdout  # the even ids of the load are in p=a


@pytest.mark.slow
def test_the_readme_python_tour_runs_as_it_stands(tmp_path):
    """The tour writes under /tmp and loads /data/load.parquet: here both are under tmp_path."""
    (tmp_path / "data").mkdir()
    setup = (f"import pyarrow as pa, pyarrow.parquet as pq\n"
             f"pq.write_table(pa.table({{'id': pa.array(range(100, 200), pa.int64()), 'p': ['a', 'b'] * 50, "
             f"'v': ['l'] * 100, 'ts': pa.array([1] * 100, pa.int64())}}), {str(tmp_path / 'data' / 'load.parquet')!r})\n")
    tour = readme_block("## Using it", "python").replace("/tmp/", f"{tmp_path}/") \
        .replace('"/data/', f'"{tmp_path}/data/')
    script = tmp_path / "tour.py"
    script.write_text(setup + tour + "\nprint('tour done', len(t.to_arrow()))\n")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tour done" in done.stdout



@pytest.mark.slow
def test_the_readme_object_storage_session_runs_as_it_stands(tmp_path):
    """It starts a Ceph RGW of its own, as a reader would, and stops it."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYSPARK_PYTHON": sys.executable}
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ALLOW_HTTP"):
        env.pop(name, None)  # the session's own server, not the test run's
    done = subprocess.run(["bash", "-e", "-x", "-c", readme_block("## On object storage", "sh")], cwd=ROOT_DIR,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1000 rows" in done.stdout and "0 problems" in done.stdout
    assert "1000 inserted" in done.stdout and "0 inserted, 1000 updated" in done.stdout
