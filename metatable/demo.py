"""`metatable demo`: the main job, on an embedded default (local files)."""
from __future__ import annotations

import os
import shutil
import time

from indexes.keys import column_stats_key, column_stats_prefix
from .metadata_table import MetadataTable


def run_metadata_demo(workdir: str) -> None:
    """A metadata-table session: commits, tombstones, merged reads, compaction, clean."""
    root = os.path.join(workdir, "metadata-demo")
    shutil.rmtree(root, ignore_errors=True)
    mdt = MetadataTable.create(root, {"files": 1, "column_stats": 4},
                               options={"metadata.compact.max_delta_commits": 5})
    started = time.perf_counter()
    for i in range(12):
        partition = f"2024-{i % 3 + 1:02d}"
        name = f"file-{i:03d}.parquet"
        stats = {column_stats_key(col, partition, name): {
            "file_name": name, "column_name": col, "min_value": i * 100, "max_value": i * 100 + 99,
            "null_count": 0, "value_count": 100, "total_size": 4000, "is_deleted": False, "resets": False}
            for col in ("id", "amount")}
        removed = {f"file-{i - 6:03d}.parquet": {"size": 0, "is_deleted": True}} if i >= 6 else {}
        mdt.commit({"files": {partition: {"files": {name: {"size": 4000 + i, "is_deleted": False}, **removed},
                                          "is_deleted": False}},
                    "column_stats": stats})
    elapsed = time.perf_counter() - started
    print(f"metadata table at {root}: 12 commits in {elapsed:.2f}s")
    for partition, record in mdt.scan("files"):
        print(f"  files[{partition}] = {sorted(record['files'])}")
    ids = list(mdt.scan("column_stats", column_stats_prefix("id")))
    print(f"  column_stats: {len(ids)} files have stats for 'id'; "
          f"min..max over all: {min(r['min_value'] for _, r in ids)}..{max(r['max_value'] for _, r in ids)}")
    print("  timeline:")
    for instant in mdt.timeline.instants():
        print(f"    {instant.time}  {instant.action.value:<12} {instant.state.value}")
