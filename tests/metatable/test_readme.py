"""The README's shell session runs as it stands: each command, pasted into a shell, succeeds."""
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
