"""The chaos run, short: every configuration of `benchmarks/chaos.py` (writers, compaction, clustering or
resize, the indexer, clean and a reader, each a process, one SIGKILLed every second or two) for a short
while; the script checks what must hold and exits non-zero when something does not. The long run is the
script itself (`python benchmarks/chaos.py`, 10 minutes per configuration). 15 s each here (about 10 kills):
the suite's time; longer where the machine is busy (beside the benchmarks' test), until writers acknowledged
6 writes and the reader compared snapshots and change records (`--min-acks`)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ["mor-bucket", "mor-consistent-hashing", "cow-bloom", "mor-record", "mor-consistent-hashing-churn",
           "cow-consistent-hashing"]
ON_THE_RGW = ["mor-consistent-hashing", "cow-bloom"]  # both table types, the most moving parts: the suite's time


@pytest.mark.slow
@pytest.mark.parametrize("config,lake", [(c, "local") for c in CONFIGS] + [(c, "s3") for c in ON_THE_RGW],
                         indirect=["lake"])
def test_everything_at_once_with_kills(config, lake, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--configs", config,
                           "--seconds", "15", "--min-acks", "6", "--kill-every", "1,2", "--workdir", str(tmp_path),
                           "--tables", lake.root], capture_output=True, text=True, timeout=600, cwd=ROOT)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, done.stdout[-2000:] + done.stderr[-3000:]
    result = lines[0]
    said = json.dumps(result)  # whole: pytest shortens a dict's repr
    assert not result["crashes"], result.get("crashed")
    assert sum(result["kills"].values()) >= 8, said
    assert result["acknowledged"] > 0 and result["reader"]["snapshots"] > 0, said
    assert result["reader"]["changes_checked"] > 0, said  # change records between snapshots were compared
    for check in ("lost", "torn", "duplicate_keys", "unexpected_failures"):
        assert result[check] == 0, f"{check}: {said}"
    assert result["fsck_healthy"] and result["reader"]["problems"] == 0, said  # every problem named
    assert result["failed_share"] <= 0.05 and result["max_ack_gap_s"] <= 30, said
    assert done.returncode == 0 and result["ok"], said
