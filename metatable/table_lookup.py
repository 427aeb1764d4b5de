"""Where keys live: `Table.lookup`, and the bloom index's tagging of writes.

Bucket index: the key's file group is computed, then verified. Otherwise the
three-level lookup of `indexes.lookup` runs over the base files of each
partition's latest slices, with record-key ranges and bloom filters from the
metadata table (a base file that has neither stays a candidate, and the report
counts it). Merge-on-read keys that live only in logs are found through the
slices whose logs mention them. Verification always reads the slice itself:
the base's key column and its logs' keys and delete markers.
"""
from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from indexes.arrow_keys import bucket_ids, partition_paths, record_keys
from indexes.bucket import bucket_file_id
from indexes.bloom import BloomFilter
from indexes.keys import bloom_filter_key, column_stats_key
from indexes.lookup import CandidateFile, LevelReport, lookup

from .errors import InvalidInputError
from .file_slice import FileSlice
from .slice_reader import SortedKeys, base_path, live_mask, log_tables, members
from .storage import Storage
from .table_config import KEY_COLUMN, TableConfig

if TYPE_CHECKING:
    from .metadata_table import MetadataTable
    from .table import Table

KeyRange = tuple[Any, Any]


@dataclass
class Explain:
    index: str
    levels: dict[str, LevelReport] = field(default_factory=dict)
    log_candidates: int = 0

    def add(self, report: LevelReport) -> None:
        mine = self.levels.setdefault(report.level, LevelReport(report.level))
        for name in ("keys_in", "pairs_in", "keys_out", "pairs_out", "files_without_index"):
            setattr(mine, name, getattr(mine, name) + getattr(report, name))

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "levels": [r.as_dict() for r in self.levels.values()],
                "log_candidates": self.log_candidates}


class MetadataIndex:
    """Key ranges and bloom filters of base files, read from the metadata table (filters cached by file
    name: a file is written once, so its filter never changes)."""

    def __init__(self, metadata: MetadataTable, config: TableConfig) -> None:
        self.metadata = metadata
        self.config = config
        self._blooms: dict[str, BloomFilter | None] = {}

    def ranges(self, partition: str, names: Sequence[str]) -> dict[str, KeyRange]:
        if "column_stats" not in self.config.metadata_indexes or not names:
            return {}
        stats = self.metadata.get_many("column_stats", [column_stats_key(KEY_COLUMN, partition, n) for n in names])
        return {r["file_name"]: (r["min_value"], r["max_value"]) for r in stats.values()}

    def blooms(self, partition: str, names: Sequence[str]) -> dict[str, BloomFilter | None]:
        if "bloom_filter" not in self.config.metadata_indexes:
            return {}
        missing = [n for n in names if n not in self._blooms]
        if missing:
            keys = {bloom_filter_key(partition, n): n for n in missing}
            records = self.metadata.get_many("bloom_filter", list(keys))
            for key, name in keys.items():
                self._blooms[name] = BloomFilter.from_bytes(records[key]["bloom_filter"], name) \
                    if key in records else None
        return {n: self._blooms[n] for n in names}


class SliceLocator:
    """Finds keys among a fixed set of file slices (one snapshot)."""

    def __init__(self, storage: Storage, root: str, config: TableConfig, slices: Mapping[tuple[str, str], FileSlice],
                 ranges: Callable[[str, Sequence[str]], Mapping[str, KeyRange]],
                 blooms: Callable[[str, Sequence[str]], Mapping[str, BloomFilter | None]],
                 cache_base_keys: int = 0) -> None:
        self.storage, self.root, self.config = storage, root, config
        self.ranges, self.blooms = ranges, blooms
        self.cache_base_keys = cache_base_keys  # how many base files' sorted keys to keep (0: read each time)
        self._base_keys: OrderedDict[str, SortedKeys] = OrderedDict()
        self.by_partition: dict[str, dict[str, FileSlice]] = defaultdict(dict)
        for (partition, file_id), fs in slices.items():
            self.by_partition[partition][file_id] = fs

    def verify(self, fs: FileSlice, keys: list[str]) -> np.ndarray:
        in_base = None
        if self.cache_base_keys and fs.base:
            path = base_path(self.root, fs)
            cached = self._base_keys.pop(path, None) or SortedKeys(path)
            self._base_keys[path] = cached
            while len(self._base_keys) > self.cache_base_keys:
                self._base_keys.popitem(last=False)
            in_base = cached.contains(keys)
        return live_mask(self.storage, self.root, self.config, fs, pa.array(keys, pa.string()), in_base)

    def in_partition(self, partition: str, keys: list[str], explain: Explain) -> dict[int, str]:
        """key index -> file id, for the keys found in `partition`."""
        group = self.by_partition.get(partition, {})
        with_base = [fs for fs in group.values() if fs.base]
        names = [fs.base.file_name for fs in with_base]
        known = self.ranges(partition, names)
        files = [CandidateFile(nm, *known.get(nm, (None, None))) for nm in names]

        def load_blooms(indexes: list[int]) -> dict[int, BloomFilter | None]:
            found = self.blooms(partition, [names[i] for i in indexes])
            return {i: found.get(names[i]) for i in indexes}

        def verify(index: int, key_indexes: np.ndarray) -> np.ndarray:
            return self.verify(with_base[index], [keys[i] for i in key_indexes])

        result = lookup(keys, files, load_blooms, verify)
        for report in result.levels:
            explain.add(report)
        found = {k: with_base[f].file_id for k, f in result.file_of.items()}
        candidates = pa.array(keys, pa.string())
        for fs in group.values():  # merge-on-read: keys that only logs know of
            if not fs.logs:
                continue
            touched = pa.concat_tables(log_tables(self.storage, self.root, self.config, fs, [KEY_COLUMN]))[KEY_COLUMN]
            mentioned = [int(i) for i in np.flatnonzero(members(candidates, touched)) if int(i) not in found]
            explain.log_candidates += len(mentioned)
            if mentioned:
                alive = np.array(mentioned)[self.verify(fs, [keys[i] for i in mentioned])]
                found.update({int(i): fs.file_id for i in alive})
        return found

    def by_bucket(self, partition: str, keys: list[str], buckets: np.ndarray, explain: Explain) -> dict[int, str]:
        group = self.by_partition.get(partition, {})
        found: dict[int, str] = {}
        report = LevelReport("1 bucket", len(keys), len(keys))
        check = LevelReport("3 file check")
        for b in np.unique(buckets):
            local = np.flatnonzero(buckets == b)
            fs = group.get(bucket_file_id(int(b)))
            if fs is None:
                continue
            report.keys_out += len(local)
            report.pairs_out += len(local)
            check.keys_in += len(local)
            check.pairs_in += len(local)
            hits = local[self.verify(fs, [keys[i] for i in local])]
            found.update({int(i): fs.file_id for i in hits})
        check.keys_out = check.pairs_out = len(found)
        explain.add(report)
        explain.add(check)
        return found

    def locate(self, keys: list[str], partitions: list[str] | None, use_buckets: bool,
               explain: Explain) -> tuple[list[str | None], list[str | None]]:
        """(partition, file id) of every key, None where absent; without `partitions`, search them all."""
        n = len(keys)
        out_partition = np.full(n, None, dtype=object)
        out_file = np.full(n, None, dtype=object)
        buckets = bucket_ids(pa.array(keys, pa.string()), self.config.index.num_buckets) if use_buckets and n \
            else np.zeros(n, dtype=np.int64)
        given = np.array(partitions, dtype=object) if partitions is not None else None
        for partition in sorted(self.by_partition):
            open_keys = np.equal(out_file, None)
            wanted = np.flatnonzero(open_keys if given is None else open_keys & (given == partition))
            if not len(wanted):
                continue
            part_keys = [keys[i] for i in wanted]
            found = self.by_bucket(partition, part_keys, buckets[wanted], explain) if use_buckets else \
                self.in_partition(partition, part_keys, explain)
            if found:
                hits = wanted[np.fromiter(found, dtype=np.int64, count=len(found))]
                out_partition[hits] = partition
                out_file[hits] = list(found.values())
        return out_partition.tolist(), out_file.tolist()


def locate(table: Table, data: pa.Table, by_metadata: bool = False) -> tuple[pa.Table, Explain]:
    config = table.config
    keys = record_keys(data, config.record_key).to_pylist()
    scoped = all(c in data.column_names for c in config.partition_by)
    partitions = partition_paths(data, config.partition_by).to_pylist() if scoped else None
    bucket = config.index.type == "bucket" and not by_metadata
    explain = Explain("bucket" if bucket else "metadata (column_stats ranges, bloom filters)")
    index = MetadataIndex(table.metadata, config)
    locator = SliceLocator(table.storage, table.path, config, table.file_slices(), index.ranges, index.blooms)
    out_partition, out_file = locator.locate(keys, partitions, bucket, explain)
    result = pa.table({"key": pa.array(keys, pa.string()), "partition": pa.array(out_partition, pa.string()),
                       "file_id": pa.array(out_file, pa.string())})
    return result, explain


def keys_table(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if type(data).__name__ == "DataFrame" and hasattr(data, "toArrow"):
        return data.toArrow()  # a lookup's keys are a small, narrow set
    raise InvalidInputError(f"lookup keys must be a pyarrow Table or a Spark DataFrame, got {type(data).__name__}")
