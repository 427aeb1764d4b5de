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
])
ABSENT = "absent"  # the kind of a row with no file: the group held none of some keys the write deleted, and
# wrote nothing to order those deletes after a concurrent write's (`FileGroupWriter`)
COUNTS = ("inserted", "updated", "deleted", "skipped", "upserted", "stale")
NO_COUNTS = dict.fromkeys(COUNTS, 0)


def stats_row(partition: str, file_id: str, file_name: str | None, kind: str | None, size: int, rows: int,
              counts: dict[str, int], indexes: dict[str, bytes | None] | None = None) -> dict[str, Any]:
    return {"partition": partition, "file_id": file_id, "file_name": file_name, "kind": kind, "size": size,
            "rows": rows, **counts, **(indexes or {"column_stats": None, "bloom_filter": None})}


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


def absent_deletes(rows: Iterable[dict[str, Any]]) -> frozenset[str]:
    """The file groups that dropped deletes of keys they did not hold (`ABSENT`)."""
    return frozenset(f"{r['partition']}/{r['file_id']}" for r in rows if r["kind"] == ABSENT)


def counts(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    rows = list(rows)
    return {k: sum(r[k] for r in rows) for k in COUNTS}
