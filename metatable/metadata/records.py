"""Metadata records per partition kind: Avro codec, tombstones and merge rules.

Merge rules are the contract in DESIGN.md ("Merge rules"). Every rule is
associative so base+logs and logs-only merges agree; where a rule alone would
not be (a live record after a tombstone), the merge result carries the
tombstone's shielding: `is_deleted` with live files for `files`, `resets` for
`column_stats`. A record is "raw" (as stored, tombstones included) until
`visible()` turns it into what readers get, or None when the key is absent.
"""
from __future__ import annotations

import io
from functools import cached_property
from typing import Any, Iterable

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from avro_schemas import schema
from indexes.column_stats import stat_value, wrap_stat_value

from metatable.config import secondary_index_name
from metatable.errors import MetatableError
from metatable.formats.avro_columns import decode_columns
from metatable.formats.log_file import Entries, avro_long
from metatable.storage.cache import SizedCache

Record = dict[str, Any]



class MetadataIntegrityError(MetatableError):
    """Merged metadata breaks an invariant (e.g. a hashing_meta seq_no that does not advance)."""


class RecordKind:
    """The records of one metadata partition kind."""

    name: str
    shares_records = False
    """Whether decoded records are kept for the whole process, by their bytes (`_SHARED`), and the same
    objects handed to every reader: only for a kind whose records nothing changes in place (merges and
    `visible` build new ones)."""

    def __init__(self) -> None:
        self.schema = schema(self.name)

    def encode(self, record: Record) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, self.schema, record)
        return buf.getvalue()

    def decode(self, raw: bytes) -> Record:
        if not self.shares_records:
            return self._decode(raw)
        return self.decode_many([raw])[0]

    def _decode(self, raw: bytes) -> Record:
        return fastavro.schemaless_reader(io.BytesIO(raw), self.schema, None)

    def decode_many(self, raws: list[bytes]) -> list[Record]:
        if not self.shares_records:
            return self._decode_many(raws)
        kept = [_SHARED.get((self.name, raw)) for raw in raws]
        missing = list(dict.fromkeys(raw for raw, found in zip(raws, kept) if found is None))
        decoded = dict(zip(missing, self._decode_many(missing)))
        for raw, record in decoded.items():
            _SHARED.put((self.name, raw), (record, len(raw)))
        return [found[0] if found is not None else decoded[raw] for raw, found in zip(raws, kept)]

    def _decode_many(self, raws: list[bytes]) -> list[Record]:
        """Decode a batch in one pass: schemaless values laid end to end are exactly an Avro data block."""
        if len(raws) < 8:
            return [self._decode(r) for r in raws]
        body = b"".join(raws)
        block = b"".join((self._block_header, avro_long(len(raws)), avro_long(len(body)), body, _SYNC))
        return list(fastavro.reader(io.BytesIO(block)))

    @cached_property
    def _block_header(self) -> bytes:
        buf = io.BytesIO()
        fastavro.writer(buf, self.schema, [], sync_marker=_SYNC)
        return buf.getvalue()

    def base_visible_many(self, raws: list[bytes]) -> list[Record]:
        """Visible records from base-file values (a base holds only visible records, see `compacted`)."""
        return self.decode_many(raws)

    def tombstone(self) -> Record:
        raise NotImplementedError

    def merge(self, older: Record, newer: Record) -> Record:
        raise NotImplementedError

    def visible(self, record: Record) -> Record | None:
        return None if record["is_deleted"] else record

    def compacted(self, record: Record) -> Record | None:
        """What a base file stores for a merged record (nothing is older than a base), None to drop it."""
        return self.visible(record)

    def check_successor(self, current: Record | None, new: Record) -> None:
        """Commit-time invariant between the current merged record and a new one (none by default)."""

    merges_columns = False  # whether `compacted_columns` merges this kind without a record per entry

    def compacted_columns(self, versions: Entries) -> Entries:
        """What a compaction writes, from every version as columns (the base's, then the logs' in order):
        each key's merged record in `compacted` form, tombstones dropped, sorted by key."""
        raise NotImplementedError

    def fold(self, records: Iterable[Record]) -> Record | None:
        """Merge oldest first."""
        merged: Record | None = None
        for r in records:
            merged = r if merged is None else self.merge(merged, r)
        return merged


_SYNC = b"metatable-block!"  # 16 bytes, Avro's sync marker size
# Decoded records of kinds that share them (`RecordKind.shares_records`), weighed at 8x their bytes (a `files`
# record of 52 files: 3,467 bytes, 17.9 KB decoded, by tracemalloc)
_SHARED: SizedCache[tuple[Record, int]] = SizedCache(64 << 20, lambda kept: 8 * kept[1])


class FilesKind(RecordKind):
    """Every snapshot reads the files of the partitions it sees: kept decoded (`shares_records`), a table open and
    scan plan of the workload benchmark's 120 partitions (~840 records) took 27 ms, 15-16 ms so."""

    name = "files"
    shares_records = True

    def tombstone(self) -> Record:
        return {"files": {}, "is_deleted": True}

    @staticmethod
    def _live(files: dict[str, Any]) -> dict[str, Any]:
        return {n: e for n, e in files.items() if not e["is_deleted"]}

    def merge(self, older: Record, newer: Record) -> Record:
        if newer["is_deleted"]:
            return {"files": self._live(newer["files"]), "is_deleted": True}
        # The newer entry wins (both live: the larger size). A tombstone stays in the merged record even
        # where it removed a file: a log+log merge may later land on an older record that still has it.
        # Only a base (compacted) or a reader (visible) drops tombstones.
        files = dict(older["files"])
        for name, entry in newer["files"].items():
            before = files.get(name)
            if not entry["is_deleted"] and before is not None and not before["is_deleted"]:
                entry = {"size": max(before["size"], entry["size"]), "is_deleted": False}
            files[name] = entry
        if older["is_deleted"]:
            return {"files": self._live(files), "is_deleted": True}
        return {"files": files, "is_deleted": False}

    def visible(self, record: Record) -> Record | None:
        live = self._live(record["files"])
        return {"files": live, "is_deleted": False} if live else None


class BloomFilterKind(RecordKind):
    name = "bloom_filter"

    def tombstone(self) -> Record:
        return {"file_name": "", "filter_type": "", "instant": "", "bloom_filter": b"", "is_deleted": True}

    def merge(self, older: Record, newer: Record) -> Record:
        return newer


def _min_max(a: Any, b: Any, pick: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    if type(a) is type(b) and not isinstance(a, dict):  # plain numbers or strings: no unwrapping
        return pick(a, b)
    return wrap_stat_value(pick(stat_value(a), stat_value(b)))


class ColumnStatsKind(RecordKind):
    """`resets` is internal: merge accepts an older record without it (a base record in visible form)."""

    name = "column_stats"

    def tombstone(self) -> Record:
        return {"file_name": "", "column_name": "", "min_value": None, "max_value": None, "null_count": 0,
                "value_count": 0, "total_size": 0, "is_deleted": True, "resets": False}

    def merge(self, older: Record, newer: Record) -> Record:
        if newer["is_deleted"] or newer["resets"]:
            return newer
        if older["is_deleted"]:
            return {**newer, "resets": True}
        return {
            "file_name": newer["file_name"],
            "column_name": newer["column_name"],
            "min_value": _min_max(older["min_value"], newer["min_value"], min),
            "max_value": _min_max(older["max_value"], newer["max_value"], max),
            "null_count": older["null_count"] + newer["null_count"],
            "value_count": older["value_count"] + newer["value_count"],
            "total_size": older["total_size"] + newer["total_size"],
            "is_deleted": False,
            "resets": older.get("resets", False),  # a base record may come in visible form
        }

    def visible(self, record: Record) -> Record | None:
        if record["is_deleted"]:
            return None
        shown = record.copy()
        del shown["resets"]
        return shown

    def compacted(self, record: Record) -> Record | None:
        return None if record["is_deleted"] else {**record, "resets": False}

    def base_visible_many(self, raws: list[bytes]) -> list[Record]:
        records = self.decode_many(raws)
        for r in records:  # freshly decoded: safe to trim in place
            del r["resets"]
        return records


class HashingMetaKind(RecordKind):
    name = "hashing_meta"

    def tombstone(self) -> Record:
        return {"version": 1, "partition_path": "", "instant": "", "seq_no": 0, "num_buckets": 0, "nodes": [],
                "is_deleted": True}

    def merge(self, older: Record, newer: Record) -> Record:
        # Monotonic here (associative); the stricter +1 is checked when a ring is committed.
        if newer["seq_no"] <= older["seq_no"]:
            raise MetadataIntegrityError(
                f"hashing_meta for {newer['partition_path']!r}: seq_no {newer['seq_no']} does not advance "
                f"past {older['seq_no']}; the metadata table holds two rings out of order"
            )
        return newer

    def check_successor(self, current: Record | None, new: Record) -> None:
        if current is not None and new["seq_no"] != current["seq_no"] + 1:
            raise MetadataIntegrityError(
                f"hashing_meta for {new['partition_path']!r}: seq_no must be {current['seq_no'] + 1} "
                f"(the current ring's + 1), got {new['seq_no']}; reload the ring and retry"
            )


class RecordIndexKind(RecordKind):
    """`record_index`: the newer entry wins, a tombstone deletes. Newer is the later `completed_at` (then
    the later position): data versions are ordered by completion, and a write can complete after one with a
    later instant (merge-on-read writers never conflict; a resize adopts later writes). Writes map many keys
    to one entry (a file group's), so `encode` keeps the last entry it encoded."""

    name = "record_index"
    order_field = "completed_at"  # a newer entry has a greater value here

    def __init__(self) -> None:
        super().__init__()
        self._last: tuple[Record | None, bytes] = (None, b"")

    def tombstone(self) -> Record:
        return {"partition_path": "", "file_id": "", "instant": "", "completed_at": 0, "is_deleted": True}

    def encode(self, record: Record) -> bytes:
        last, raw = self._last
        if record is not last:
            raw = super().encode(record)
            self._last = (record, raw)
        return raw

    def merge(self, older: Record, newer: Record) -> Record:
        return newer if newer[self.order_field] >= older[self.order_field] else older

    merges_columns = True

    def compacted_columns(self, versions: Entries) -> Entries:
        """The merge rule over columns: per key, the version with the greatest `completed_at`, then the
        latest. Only the distinct values are decoded (a file slice's keys share one). Compacting the 6M
        entries of an SF 1 load: 69 s record by record, 7.9 s so (two file groups at a time)."""
        if not len(versions):
            return versions
        completed, deleted = self.order_and_deleted(versions.values)
        order = pc.sort_indices(pa.table({"key": versions.keys, "completed": completed,
                                          "position": np.arange(len(versions))}),
                                [("key", "ascending"), ("completed", "ascending"), ("position", "ascending")])
        order = order.to_numpy()
        keys = versions.keys.take(pa.array(order))
        last = np.ones(len(order), dtype=bool)
        last[:-1] = pc.not_equal(keys.slice(0, len(keys) - 1), keys.slice(1)).to_numpy(zero_copy_only=False)
        winners = order[last & ~deleted[order]]
        return versions.take(winners)

    def order_and_deleted(self, values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """Each value's `order_field` and `is_deleted`, decoding only the distinct values."""
        encoded = pc.dictionary_encode(values)
        records = [self.decode(raw) for raw in encoded.dictionary.to_pylist()]
        which = encoded.indices.to_numpy()
        return (np.array([r[self.order_field] for r in records], dtype=np.int64)[which],
                np.array([r["is_deleted"] for r in records], dtype=bool)[which])

    def base_visible_many(self, raws: list[bytes]) -> list[Record]:
        """Each distinct value decoded once (the keys of one file slice share theirs): callers get shared,
        read-only records."""
        decoded: dict[bytes, Record] = {}
        decode = self.decode
        return [decoded[r] if r in decoded else decoded.setdefault(r, decode(r)) for r in raws]


class SecondaryIndexKind(RecordIndexKind):
    """`secondary_index_<name>`: forward and reverse entries (`indexes.secondary_keys`). The later `written_at`
    wins (when the entry was computed: each computation knew every earlier one), a tombstone deletes."""

    name = "secondary_index"
    order_field = "written_at"

    def tombstone(self) -> Record:
        return {**super().tombstone(), "value": None, "ordering": None, "written_at": 0}

    def base_visible_many(self, raws: list[bytes]) -> list[Record]:
        return self.decode_many(raws)  # reverse entries' values differ key by key

    def order_and_deleted(self, values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """Decoded as columns: reverse entries' values differ key by key."""
        decoded = decode_columns(self.schema, values)
        return (decoded[self.order_field].to_numpy(),
                decoded["is_deleted"].to_numpy(zero_copy_only=False).astype(bool))


KINDS: dict[str, RecordKind] = {k.name: k for k in (FilesKind(), BloomFilterKind(), ColumnStatsKind(),
                                                     HashingMetaKind(), RecordIndexKind(), SecondaryIndexKind())}


def kind_named(partition: str) -> RecordKind | None:
    """The record kind of a metadata partition (every secondary index's is one), None for an unknown name."""
    return KINDS["secondary_index"] if secondary_index_name(partition) is not None else KINDS.get(partition)
