"""What a write task reports about the files it wrote: one statistics row per file (and per file group
whose rows changed nothing), small enough to collect on the driver, which commits those files."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import pyarrow as pa

STATS_SCHEMA = pa.schema([
    ("partition", pa.string()), ("file_id", pa.string()), ("file_name", pa.string()), ("kind", pa.string()),
    ("size", pa.int64()), ("rows", pa.int64()), ("inserted", pa.int64()), ("updated", pa.int64()),
    ("deleted", pa.int64()), ("skipped", pa.int64()), ("upserted", pa.int64()), ("stale", pa.int64()),
    ("column_stats", pa.binary()),
    ("bloom_filter", pa.binary()),
    ("absent_keys", pa.binary()),  # of an `ABSENT` row
])
ABSENT = "absent"  # the kind of a row with no file: keys the write deleted that it did not find, and wrote
# nothing to order after a concurrent write of them (`FileGroupWriter`); the commit probes for them
ABSENT_GROUP = ""  # the file group of a delete's rows whose keys the index found nowhere (`write_engine`)
COUNTS = ("inserted", "updated", "deleted", "skipped", "upserted", "stale")
NO_COUNTS = dict.fromkeys(COUNTS, 0)


def stats_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Statistics rows as a table, once for all the file groups a write task wrote: a table per file group
    (`from_pylist` of its one row, 0.11 ms) was the largest single line of a writer thread's profile in a
    workload-benchmark batch of 480 groups."""
    return pa.Table.from_pydict({name: [row.get(name) for row in rows] for name in STATS_SCHEMA.names},
                                schema=STATS_SCHEMA)


def stats_row(partition: str, file_id: str, file_name: str | None, kind: str | None, size: int, rows: int,
              counts: dict[str, int], indexes: dict[str, bytes | None] | None = None) -> dict[str, Any]:
    return {"partition": partition, "file_id": file_id, "file_name": file_name, "kind": kind, "size": size,
            "rows": rows, **counts, **(indexes or {"column_stats": None, "bloom_filter": None})}


def absent_row(partition: str, file_id: str, keys: pa.Array | pa.ChunkedArray) -> dict[str, Any]:
    """An `ABSENT` row: the record keys, as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    table = pa.table({"key": keys})
    with pa.ipc.new_stream(sink, table.schema) as out:
        out.write_table(table)
    return {**stats_row(partition, file_id, None, ABSENT, 0, len(keys), NO_COUNTS),
            "absent_keys": sink.getvalue().to_pybytes()}


@dataclass(frozen=True)
class WrittenFile:
    partition: str
    file_id: str
    file_name: str
    kind: str  # "base", "log" or "dual" (a consistent-hashing dual-write log, `dual_writes`)
    size: int
    rows: int
    column_stats: bytes | None = None  # pickled column_stats records of a base file
    bloom_filter: bytes | None = None  # its serialized record-key bloom filter

    @property
    def group(self) -> str:
        return f"{self.partition}/{self.file_id}"

    @property
    def relative(self) -> str:
        """How commit metadata lists it: `<partition>/<file name>`."""
        return f"{self.partition}/{self.file_name}"


def written_files(rows: Iterable[dict[str, Any]]) -> list[WrittenFile]:
    return [WrittenFile(r["partition"], r["file_id"], r["file_name"], r["kind"], r["size"], r["rows"],
                        r.get("column_stats"), r.get("bloom_filter")) for r in rows if r["file_name"]]


def absent_deletes(rows: Iterable[dict[str, Any]]) -> dict[str, pa.ChunkedArray]:
    """Partition -> the keys a write deleted there without finding them (`ABSENT` rows)."""
    found: dict[str, list[pa.Array]] = {}
    for r in rows:
        if r["kind"] == ABSENT:
            keys = pa.ipc.open_stream(r["absent_keys"]).read_all()["key"]
            found.setdefault(r["partition"], []).extend(keys.chunks)
    return {p: pa.chunked_array(chunks, pa.string()) for p, chunks in found.items()}


def counts(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    rows = list(rows)
    return {k: sum(r[k] for r in rows) for k in COUNTS}
