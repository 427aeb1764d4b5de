"""The README's Python tour and shell session run as they stand: each line, pasted into Python or a shell,
succeeds."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shell_session() -> str:
    text = open(os.path.join(ROOT_DIR, "README.md")).read()
    after = text[text.index("From the shell"):]
    return re.search(r"```sh\n(.*?)```", after, re.S).group(1)


@pytest.mark.slow
def test_the_readme_shell_session_runs_as_it_stands(tmp_path):
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           "TMPDIR": str(tmp_path), "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(["bash", "-e", "-x", "-c", shell_session()], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(5 rows)" in done.stderr and "rebuilt the metadata table" in done.stdout
    assert "0 inserted, 100 updated" in done.stdout  # the even ids of the load are in p=a


def python_tour() -> str:
    text = open(os.path.join(ROOT_DIR, "README.md")).read()
    after = text[text.index("## Using it"):]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


@pytest.mark.slow
def test_the_readme_python_tour_runs_as_it_stands(tmp_path):
    """The tour writes under /tmp and loads /data/load.parquet: here both are under tmp_path."""
    (tmp_path / "data").mkdir()
    setup = (f"import pyarrow as pa, pyarrow.parquet as pq\n"
             f"pq.write_table(pa.table({{'id': pa.array(range(100, 200), pa.int64()), 'p': ['a', 'b'] * 50, "
             f"'v': ['l'] * 100, 'ts': pa.array([1] * 100, pa.int64())}}), {str(tmp_path / 'data' / 'load.parquet')!r})\n")
    tour = python_tour().replace("/tmp/", f"{tmp_path}/").replace('"/data/', f'"{tmp_path}/data/')
    script = tmp_path / "tour.py"
    script.write_text(setup + tour + "\nprint('tour done', len(t.to_arrow()))\n")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tour done" in done.stdout

