"""`Table.lookup`: where each key lives, through the table's index.

Bucket index: the key's file group is computed, then verified. Otherwise the
three-level lookup of `indexes.lookup` runs over the base files of each
partition's latest slices, with ranges from `column_stats` and filters from
`bloom_filter` (a base file that has neither stays a candidate, and the report
counts it). Merge-on-read keys that live only in logs are found through the
slices whose logs mention them. Verification always reads the slice itself:
the base's key column and its logs' keys and delete markers.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from indexes.arrow_keys import bucket_ids, partition_paths, record_keys
from indexes.bloom import BloomFilter
from indexes.keys import bloom_filter_key, column_stats_key
from indexes.lookup import CandidateFile, LevelReport, lookup

from .errors import InvalidInputError
from .file_slice import FileSlice
from .slice_reader import live_mask, log_tables, members
from .table_config import KEY_COLUMN
from .write_path import bucket_file_id

if TYPE_CHECKING:
    from .table import Table


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


def locate(table: Table, data: pa.Table, by_metadata: bool = False) -> tuple[pa.Table, Explain]:
    config = table.config
    keys_col = record_keys(data, config.record_key)
    keys = keys_col.to_pylist()
    n = len(keys)
    scoped = bool(config.partition_by) and all(c in data.column_names for c in config.partition_by)
    given = partition_paths(data, config.partition_by).to_pylist() if scoped or not config.partition_by else None
    slices = table.file_slices()
    by_partition: dict[str, dict[str, FileSlice]] = defaultdict(dict)
    for (partition, file_id), fs in slices.items():
        by_partition[partition][file_id] = fs
    out_partition: list[str | None] = [None] * n
    out_file: list[str | None] = [None] * n
    bucket = config.index.type == "bucket" and config.index.engine == "simple" and not by_metadata
    explain = Explain("bucket" if bucket else "metadata (column_stats ranges, bloom filters)")
    buckets = bucket_ids(keys_col, config.index.num_buckets) if bucket and n else np.zeros(n, dtype=np.int64)
    for partition in sorted(by_partition):
        wanted = np.arange(n) if given is None else np.flatnonzero(np.array(given, dtype=object) == partition)
        wanted = wanted[[out_file[i] is None for i in wanted]] if len(wanted) else wanted
        if not len(wanted):
            continue
        part_keys = [keys[i] for i in wanted]
        group = by_partition[partition]
        found = _by_bucket(table, group, part_keys, buckets[wanted], explain) if bucket else \
            _by_metadata(table, partition, group, part_keys, explain)
        for local, file_id in found.items():
            out_partition[wanted[local]] = partition
            out_file[wanted[local]] = file_id
    result = pa.table({"key": pa.array(keys, pa.string()), "partition": pa.array(out_partition, pa.string()),
                       "file_id": pa.array(out_file, pa.string())})
    return result, explain


def _verify(table: Table, fs: FileSlice, keys: list[str]) -> np.ndarray:
    return live_mask(table.storage, table.path, table.config, fs, pa.array(keys, pa.string()))


def _by_bucket(table: Table, group: dict[str, FileSlice], keys: list[str], buckets: np.ndarray,
               explain: Explain) -> dict[int, str]:
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
        hits = local[_verify(table, fs, [keys[i] for i in local])]
        found.update({int(i): fs.file_id for i in hits})
    check.keys_out = check.pairs_out = len(found)
    explain.add(report)
    explain.add(check)
    return found


def _by_metadata(table: Table, partition: str, group: dict[str, FileSlice], keys: list[str],
                 explain: Explain) -> dict[int, str]:
    config, mdt = table.config, table.metadata
    with_base = [fs for fs in group.values() if fs.base]
    names = [fs.base.file_name for fs in with_base]
    ranges: dict[str, Any] = {}
    if "column_stats" in config.metadata_indexes and names:
        stats = mdt.get_many("column_stats", [column_stats_key(KEY_COLUMN, partition, nm) for nm in names])
        ranges = {r["file_name"]: r for r in stats.values()}
    files = [CandidateFile(nm, ranges[nm]["min_value"] if nm in ranges else None,
                           ranges[nm]["max_value"] if nm in ranges else None) for nm in names]

    def load_blooms(indexes: list[int]) -> dict[int, BloomFilter | None]:
        if "bloom_filter" not in config.metadata_indexes or not indexes:
            return {}
        wanted = {bloom_filter_key(partition, names[i]): i for i in indexes}
        records = mdt.get_many("bloom_filter", list(wanted))
        return {i: BloomFilter.from_bytes(records[k]["bloom_filter"], names[i]) if k in records else None
                for k, i in wanted.items()}

    def verify(index: int, key_indexes: np.ndarray) -> np.ndarray:
        return _verify(table, with_base[index], [keys[i] for i in key_indexes])

    result = lookup(keys, files, load_blooms, verify)
    for report in result.levels:
        explain.add(report)
    found = {k: with_base[f].file_id for k, f in result.file_of.items()}
    # merge-on-read: keys that only logs know of
    candidates = pa.array(keys, pa.string())
    for fs in group.values():
        if not fs.logs:
            continue
        touched = pa.concat_tables(log_tables(table.storage, table.path, config, fs, [KEY_COLUMN]))[KEY_COLUMN]
        mentioned = np.flatnonzero(members(candidates, touched))
        mentioned = np.array([i for i in mentioned if i not in found], dtype=np.int64)
        explain.log_candidates += len(mentioned)
        if len(mentioned):
            alive = mentioned[_verify(table, fs, [keys[i] for i in mentioned])]
            found.update({int(i): fs.file_id for i in alive})
    return found


def keys_table(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if type(data).__name__ == "DataFrame" and hasattr(data, "toArrow"):
        return data.toArrow()  # a lookup's keys are a small, narrow set
    raise InvalidInputError(f"lookup keys must be a pyarrow Table or a Spark DataFrame, got {type(data).__name__}")
