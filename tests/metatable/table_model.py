"""A plain-Python model of a keyed table, and helpers to check a real table against it."""
from __future__ import annotations

import os
import shutil
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from indexes.column_stats import file_column_stats
from indexes.keys import column_stats_key

from metatable.formats.log_file import LogFile
from metatable.storage.base import is_temporary
from metatable.storage.location import storage_for
from metatable.table import Table
from metatable.table_config import TableConfig
from metatable.timeline.instant import Action
from metatable.write.write_client import WriteResult

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("v", pa.string()), ("ts", pa.int64())])


class TableModel:
    def __init__(self, partitioned: bool) -> None:
        self.partitioned = partitioned
        self.rows: dict[Any, dict] = {}

    def identity(self, row: dict) -> Any:
        return (row["p"], row["id"]) if self.partitioned else row["id"]

    def _dedupe(self, rows: list[dict]) -> dict[Any, dict]:
        best: dict[Any, dict] = {}
        rank = lambda r: (r["ts"], r["id"], r["p"], (r["v"] is not None, r["v"] or ""))  # noqa: E731
        for r in rows:
            k = self.identity(r)
            if k not in best or rank(r) > rank(best[k]):
                best[k] = r
        return best

    def apply(self, operation: str, rows: list[dict]) -> dict[str, int]:
        """Apply a write; what a write result counts: keys inserted, updated, deleted, inserts skipped, and
        updates that lost on the ordering field (stale)."""
        counts = dict.fromkeys(["inserted", "updated", "deleted", "skipped", "stale"], 0)
        if operation == "delete":
            for k in {self.identity(r) for r in rows}:
                counts["deleted"] += self.rows.pop(k, None) is not None
            return counts
        for k, r in self._dedupe(rows).items():
            present = k in self.rows
            wins = not present or r["ts"] >= self.rows[k]["ts"]
            counts["skipped" if operation == "insert" and present else "inserted" if not present
                   else "updated" if wins else "stale"] += 1
            if operation == "insert":
                self.rows.setdefault(k, r)
            elif wins:
                self.rows[k] = r
        return counts

    def expected(self) -> list[dict]:
        return sorted(self.rows.values(), key=lambda r: (r["p"], r["id"]))


def check_counts(result: WriteResult, expected: dict[str, int], config: TableConfig, operation: str) -> None:
    """A write result's counts against the model's (`TableModel.apply`)."""
    got = {k: getattr(result, k) for k in expected}
    if operation == "upsert" and config.merge_on_read and not config.options["write.count_updates"]:
        # rows of file groups with a slice are not told apart; a new file group's are inserts
        assert got["updated"] == got["stale"] == 0 and got["inserted"] <= expected["inserted"]
        assert got["inserted"] + result.upserted == expected["inserted"] + expected["updated"] + expected["stale"]
    else:
        assert (got, result.upserted) == (expected, 0)


def sort_rows(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["p"], r["id"]))


def data_files_on_disk(table: Table) -> set[str]:
    """Data files on disk, but for the dual-write logs kept for a pending resize (adopted when it commits)."""
    pending = {i.time for i in table.context.timeline.pending([Action.REPLACECOMMIT])}
    out = set()
    for info in table.storage.walk(table.path):
        relative = info.path[len(table.path) + 1:]
        name = os.path.basename(relative)
        if relative.startswith(".metatable/") or is_temporary(name):
            continue
        if LogFile.is_log_name(name) and LogFile.parse(name).base_instant in pending:
            continue
        if name.endswith(".parquet") or LogFile.is_log_name(name):
            out.add(relative)
    return out


def copy_table(source: str, target: str) -> None:
    """A copy of a table's files (not its SST read caches), on the same storage."""
    storage = storage_for(source)
    if storage.local:
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("sst_cache"))
        return
    for info in storage.walk(source):
        relative = info.path[len(source) + 1:]
        if "sst_cache" not in relative.split("/"):
            storage.write_atomic(f"{target}/{relative}", storage.read(info.path))


def read_parquet(table: Table, path: str) -> tuple[pa.Table, pq.FileMetaData]:
    """A base file's rows and footer, through the table's storage."""
    parquet = pq.ParquetFile(table.storage.open_input(path))
    return parquet.read(), parquet.metadata


def files_in_metadata(table: Table) -> set[str]:
    out = set()
    for partition, names in table.context.view().live_files.items():
        out |= {name if partition == "." else f"{partition}/{name}" for name in names}
    return out


def check_metadata(table: Table) -> None:
    """The files partition lists exactly the data files on disk; the base of every latest file slice has
    column stats that match the file, and no other base file has any (superseded ones were tombstoned)."""
    assert files_in_metadata(table) == data_files_on_disk(table)
    if "column_stats" not in table.config.metadata_indexes:
        return
    columns = table.config.stats_columns()
    latest = {(fs.partition, fs.base.file_name) for fs in table.file_slices().values() if fs.base}
    for relative in files_in_metadata(table):
        if not relative.endswith(".parquet"):
            continue
        partition, _, name = relative.rpartition("/")
        partition = partition or "."
        path = os.path.join(table.path, relative)
        rows, footer = read_parquet(table, path)
        expected = file_column_stats(rows, columns, partition, name, footer)
        got = table.metadata.get_many("column_stats", list(expected))
        if (partition, name) not in latest:
            # a resize cannot tombstone what a write that completed before it, at a later instant, recorded
            # (docs/design-notes.md, "Metadata indexes"): clean does, with the file
            assert got == {} or table.config.index.consistent_hashing, \
                f"{relative} is no longer the latest base of its file group, yet has column stats"
            continue
        assert got == {k: {kk: vv for kk, vv in v.items() if kk != "resets"} for k, v in expected.items()}, relative
        assert set(got) == {column_stats_key(c, partition, name) for c in columns}
