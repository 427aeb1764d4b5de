"""The README's Python tour and shell sessions run as they stand: each line, pasted into Python or a shell,
succeeds.

The three run at the same time, each in a process of its own, when the first test asks: one after the other
they took 124 s of the suite, together 84 s. (With `test_examples`' script as a fourth, the four took as long as the
three and that one apart.)
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_block(after: str, language: str) -> str:
    """The first ```language block of the README after the text `after`."""
    text = open(os.path.join(ROOT_DIR, "README.md")).read()
    return re.search(rf"```{language}\n(.*?)```", text[text.index(after):], re.S).group(1)


def shell_session(tmp: Path) -> subprocess.Popen:
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           "TMPDIR": str(tmp), "PYSPARK_PYTHON": sys.executable}
    return subprocess.Popen(["bash", "-e", "-x", "-c", readme_block("From the shell", "sh")], cwd=tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def python_tour(tmp: Path) -> subprocess.Popen:
    """The tour writes under /tmp and loads /data/load.parquet: here both are under `tmp`."""
    (tmp / "data").mkdir()
    setup = (f"import pyarrow as pa, pyarrow.parquet as pq\n"
             f"pq.write_table(pa.table({{'id': pa.array(range(100, 200), pa.int64()), 'p': ['a', 'b'] * 50, "
             f"'v': ['l'] * 100, 'ts': pa.array([1] * 100, pa.int64())}}), {str(tmp / 'data' / 'load.parquet')!r})\n")
    tour = readme_block("## Using it", "python").replace("/tmp/", f"{tmp}/").replace('"/data/', f'"{tmp}/data/')
    script = tmp / "tour.py"
    script.write_text(setup + tour + "\nprint('tour done', len(t.to_arrow()))\n")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.Popen([sys.executable, str(script)], cwd=tmp, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def object_storage_session(tmp: Path) -> subprocess.Popen:
    """It starts a Ceph RGW of its own, as a reader would, and stops it."""
    env = {**os.environ, "TMPDIR": str(tmp), "PYSPARK_PYTHON": sys.executable}
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ALLOW_HTTP"):
        env.pop(name, None)  # the session's own server, not the test run's
    return subprocess.Popen(["bash", "-e", "-x", "-c", readme_block("## On object storage", "sh")], cwd=ROOT_DIR,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


SESSIONS = {"test_the_readme_shell_session_runs_as_it_stands": shell_session,
            "test_the_readme_python_session_runs_as_it_stands": python_tour,
            "test_the_readme_object_storage_session_runs_as_it_stands": object_storage_session}


@pytest.fixture(scope="module")
def started(tmp_path_factory, request) -> dict[str, subprocess.Popen]:
    """The selected tests' processes, by test name, all started when the first test asks."""
    mine = {item.originalname for item in request.session.items if item.module is sys.modules[__name__]}
    processes = {name: start(tmp_path_factory.mktemp(name.removeprefix("test_")[:30]))
                 for name, start in SESSIONS.items() if name in mine}
    yield processes
    for process in processes.values():
        if process.poll() is None:  # a test that failed before its process finished
            process.kill()
            process.communicate()


@pytest.fixture
def run(started, request) -> tuple[str, str]:
    """This test's process, finished: its stdout and stderr."""
    process = started[request.node.originalname]
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return out, err


@pytest.mark.slow
def test_the_readme_shell_session_runs_as_it_stands(run):
    out, err = run
    assert "(5 rows)" in err and "rebuilt the metadata table" in out
    assert "0 inserted, 100 updated" in out  # the even ids of the load are in p=a


@pytest.mark.slow
def test_the_readme_python_session_runs_as_it_stands(run):
    out, _ = run
    assert "tour done" in out


@pytest.mark.slow
def test_the_readme_object_storage_session_runs_as_it_stands(run):
    out, _ = run
    assert "1000 rows" in out and "0 problems" in out
    assert "1000 inserted" in out and "0 inserted, 1000 updated" in out
