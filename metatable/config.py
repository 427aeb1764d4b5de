"""Every configuration key, defined once with its type, default and doc.

Options are plain `dict[str, value]` keyed by the dotted names below; `resolve`
fills defaults and rejects unknown keys or bad values with a message that lists
what is valid.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from metatable.errors import ConfigError

THREADS = os.cpu_count() or 2  # threads of an in-process write or get: the Arrow work they do releases the GIL
# the least `write.parquet.page_size`: each page of a base file but a column chunk's last holds at least this much
MIN_PAGE_BYTES = 1 << 10


@dataclass(frozen=True)
class Option:
    name: str
    type: type
    default: Any
    doc: str
    minimum: float | None = None
    choices: tuple[Any, ...] | None = None

    def check(self, value: Any) -> Any:
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if self.type is int and isinstance(value, bool) or not isinstance(value, self.type):
            raise ConfigError(f"option {self.name} must be {self.type.__name__}, got {value!r} ({self.doc})")
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(f"option {self.name} must be >= {self.minimum}, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"option {self.name} must be one of {list(self.choices)}, got {value!r}")
        return value


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in [
        Option("metadata.compact.max_delta_commits", int, 10,
               "compact a metadata file group once it has this many log files", minimum=1),
        Option("metadata.compact.max_log_bytes", int, 32 << 20,
               "compact a metadata file group once its log files hold this many bytes (a big load's record "
               "index entries go to SST at once, not into every read)", minimum=1),
        Option("metadata.clean.retain_file_slices", int, 2,
               "file slices kept per metadata file group by clean (the latest counts)", minimum=1),
        Option("metadata.auto_compact", bool, True,
               "compact, clean and archive the metadata table after each commit"),
        Option("metadata.archive.max_instants", int, 60,
               "archive the metadata table's oldest completed instants once its timeline holds more than this",
               minimum=2),
        Option("metadata.archive.min_instants", int, 30,
               "... leaving at least this many active (and every one a pending data instant still needs)", minimum=1),
        Option("lock.timeout_s", float, 60.0, "how long to wait for the table lock", minimum=0.0),
        Option("lock.lease_s", float, 60.0,
               "on an object store, the table lock is a lease: its holder renews it every lease_s / 6, and a "
               "holder silent for lease_s (paused, cut off, dead) loses it to the next process, and then fails "
               "instead of committing (see timeline/lock.py)", minimum=0.5),
        Option("metadata.sst_cache_bytes", int, 4 << 30,
               "on an object store, SST base files are downloaded whole into a local read cache of this many "
               "bytes at most (least recently opened evicted first)", minimum=0),
        Option("metadata.files.file_groups", int, 1, "file groups of the files partition", minimum=1),
        Option("metadata.column_stats.file_groups", int, 2, "file groups of the column_stats partition", minimum=1),
        Option("metadata.bloom_filter.file_groups", int, 2, "file groups of the bloom_filter partition", minimum=1),
        Option("metadata.hashing_meta.file_groups", int, 1, "file groups of the hashing_meta partition", minimum=1),
        Option("metadata.record_index.file_groups", int, 4,
               "file groups of the record_index partition (set when the index is created or scheduled)", minimum=1),
        Option("metadata.secondary_index.file_groups", int, 2,
               "file groups of each secondary index's partition (set when the index is created or scheduled)",
               minimum=1),
        Option("indexer.catchup_timeout_s", float, 300.0,
               "the async indexer waits this long for writes still inflight (with a live heartbeat) that it must "
               "catch up; then it aborts, removes the partitions it was building, and can be scheduled again",
               minimum=0.0),
        Option("index.bloom.fpp", float, 0.001,
               "target false-positive rate of per-file bloom filters (see docs/design-notes.md for the measurement)",
               minimum=1e-9),
        Option("write.target_file_size", int, 128 << 20,
               "bloom index: inserts fill file groups below this size first, then open new ones sized toward it",
               minimum=1 << 10),
        Option("column_stats.max_columns", int, 32,
               "column stats cover the record key and the first this-many primitive columns", minimum=0),
        Option("write.log.block_format", str, "arrow",
               "how a merge-on-read log block carries its rows: 'arrow' (an Arrow IPC file: measured fastest to "
               "write and read, see docs/design-notes.md), 'parquet' or 'avro' (one Avro record per row)",
               choices=("arrow", "parquet", "avro")),
        Option("write.log.compression", str, "zstd",
               "codec of an 'arrow' log block: zstd is smaller than a snappy Parquet block and reads 1.7-2.2x "
               "faster; lz4 reads a little faster for 1.8x zstd's bytes (docs/design-notes.md)",
               choices=("zstd", "lz4", "none")),
        Option("write.parquet.compression", str, "snappy",
               "Parquet codec of data files: snappy loads SF 1 in 8.8 s against 10.5 s with zstd, for 276 against "
               "216 MB, and reads as fast (docs/design-notes.md)", choices=("snappy", "zstd", "gzip", "none")),
        Option("write.parquet.key_compression", str, "lz4_raw",
               "Parquet codec of the record-key column: a key lookup decompresses one key page, and lz4_raw does "
               "that ~5x faster than zstd for ~2x the bytes of that column (docs/design-notes.md)",
               choices=("lz4_raw", "zstd", "snappy", "gzip", "none")),
        Option("write.parquet.page_size", int, 8 << 10,
               "target bytes of a Parquet data page before compression: a key lookup reads one page of the key "
               "column, so small pages make lookups cheap (docs/design-notes.md)", minimum=MIN_PAGE_BYTES),
        Option("compaction.inline_every", int, 0,
               "merge-on-read: compact every file group that has logs after every N deltacommits (0: never; the "
               "log triggers below compact only the file groups that need it)", minimum=0),
        Option("compaction.trigger.log_count", int, 5,
               "merge-on-read: a file group whose latest slice has this many logs is compacted after the commit "
               "that wrote its last one (0: no count trigger). Measured (docs/design-notes.md): each log costs a "
               "full read ~4 ms per 10 file groups and compacting a group ~5 ms, so 5 keeps reads within ~4x of a "
               "compacted table's for ~1 ms per group per commit", minimum=0),
        Option("compaction.trigger.log_bytes", int, 32 << 20,
               "merge-on-read: ... or whose logs hold this many bytes (0: no byte trigger)", minimum=0),
        Option("compaction.mode", str, "inline",
               "what a log trigger does: 'inline' compacts the file groups right after the commit, in the "
               "writer's process; 'schedule' plans the compaction for another process (`metatable compact`, "
               "`Table.run_compaction`), so writers never spend the time; 'off' does neither",
               choices=("inline", "schedule", "off")),
        Option("clean.retain_commits", int, 10,
               "clean keeps every file slice that the last N completed commits can read: how far back time travel "
               "(`as_of`) and change records (`changes`) reach; what it costs is the slices superseded in those "
               "commits (docs/design-notes.md, \"Reading through time\")", minimum=1),
        Option("clean.retain_hours", float, 0.0,
               "... and every file slice that commits completed in the last N hours can read (0: by count only): "
               "a change feed whose readers may stop for a day keeps 24", minimum=0.0),
        Option("changes.before_images", bool, False,
               "every write also keeps, per file group it writes, the rows it replaces or deletes as they were "
               "before it (`.metatable/images/<instant>/`), so that `changes()` reads its pre-images from those "
               "instead of from the table's pages: the rows the write replaces are read at write time, and stored "
               "again until clean removes the slices they came from (docs/design-notes.md, \"Reading through "
               "time\"). An in-process merge-on-read write also keeps its own change records there, which "
               "`changes(every_version=True)` reads. Delta Lake's `delta.enableChangeDataFeed` is the same trade"),
        Option("clean.inline", bool, True, "clean after each commit"),
        Option("clean.sweep_every_s", float, 3600.0,
               "a clean also sweeps what dead processes left (staging files, markers, orphaned data files) when "
               "the last sweep is this old: the sweep walks every file of the table, which was 0.96 s of a 3.4 s "
               "upsert at 600 commits when every clean swept (0: every clean sweeps; `metatable fsck --repair` "
               "sweeps at once)", minimum=0.0),
        Option("archive.max_instants", int, 60,
               "once the active timeline holds more instants than this, the oldest completed ones move into the "
               "archive (after a commit, with clean); every write lists and reads the active timeline, so this "
               "bounds its cost: measured in `benchmarks/long_life.py`, flat from 500 to 2,000 commits "
               "(docs/design-notes.md)", minimum=2),
        Option("archive.min_instants", int, 30,
               "archival leaves at least this many instants active (and every instant that a pending one or "
               "clean's retained commits still need: docs/design-notes.md)", minimum=1),
        Option("clustering.small_file_limit", int, 96 << 20,
               "clustering takes file slices whose base file is smaller than this (bytes)", minimum=0),
        Option("clustering.max_bytes_per_group", int, 2 << 30,
               "a clustering group closes before it would pass this many bytes", minimum=1),
        Option("clustering.max_groups", int, 30, "clustering plans at most this many groups", minimum=1),
        Option("clustering.sort_columns", str, "",
               "comma-separated columns clustering sorts rows by before splitting them into files (empty: none)"),
        Option("clustering.strategy", str, "size",
               "how clustering groups file slices: 'size' (small files, largest first), 'key_range' (slices whose "
               "record-key ranges overlap, so that key-range pruning works afterwards) or 'recent' (size, in the "
               "clustering.recent_partitions most recent partitions)", choices=("size", "key_range", "recent")),
        Option("clustering.recent_partitions", int, 2,
               "strategy 'recent': how many partitions, most recently written first", minimum=1),
        Option("clustering.updates", str, "reject",
               "a write to a file group under a pending clustering: 'reject' (a ClusteringConflict naming the "
               "clustering to wait for) or 'abort_clustering' (the write wins; the clustering is rolled back)",
               choices=("reject", "abort_clustering")),
        Option("clustering.inline_every", int, 0, "cluster after every N write commits (0: only when asked)",
               minimum=0),
        Option("bucket.split_threshold", float, 2.0,
               "consistent hashing: a resize splits a bucket bigger than this times write.target_file_size",
               minimum=1.0),
        Option("bucket.merge_threshold", float, 0.2,
               "consistent hashing: adjacent buckets each smaller than this times write.target_file_size merge "
               "(while together under the target)", minimum=0.0),
        Option("bucket.min_buckets", int, 1, "consistent hashing: a resize keeps at least this many buckets per "
               "partition", minimum=1),
        Option("bucket.max_buckets", int, 4096, "consistent hashing: a resize keeps at most this many buckets per "
               "partition", minimum=1),
        Option("bucket.split_point", str, "quantile",
               "consistent hashing: 'quantile' splits a bucket into ceil(size / target) children at the quantiles "
               "of its key hashes (one round fixes skew); 'middle' splits it in two at the range middle (RFC-42)",
               choices=("quantile", "middle")),
        Option("clustering.resize.max_bytes", int, 64 << 30, "consistent hashing: one resize plan rewrites at most "
               "this many bytes", minimum=1),
        Option("clustering.resize.max_partitions", int, 64, "consistent hashing: one resize plan covers at most "
               "this many partitions", minimum=1),
        Option("clustering.resize.writer_wait_s", float, 600.0,
               "consistent hashing: how long a resize waits for writes that began before it was planned (they "
               "cannot dual-write) before it gives up and is rolled back", minimum=0.0),
        Option("write.chunk_rows", int, 1 << 20,
               "an in-process write reads a stream input (Parquet path, dataset, RecordBatchReader), a Spark write "
               "of a small input gathers its rows, and a Spark write of Parquet files reads them, this many rows at "
               "a time", minimum=1),
        Option("write.spill_bytes", int, 256 << 20,
               "an in-process stream write, and each Spark write task but a shuffled load's, holds its "
               "tagged rows in memory up to this many bytes (Arrow's count); past it they are spilled by file "
               "group to files under .metatable/spill, so memory follows this, not the input (0: always spill)",
               minimum=0),
        Option("write.prefetch_key_bytes", int, 256 << 20,
               "a stream write that tells inserts from updates reads the key columns of the file groups its "
               "chunks name while later chunks arrive (Spark's rows moving into Python, a Parquet file read), "
               "holding at most this many bytes of them ahead of their writers (0: no reading ahead)",
               minimum=0),
        Option("write.spill_compression", str, "none",
               "codec of the spill files (Arrow IPC, local, removed when the write ends); lz4 made the SF 1 load "
               "from a Parquet path 0.7-1.7 s slower in-process and 0.6 s on Spark (docs/design-notes.md) for "
               "files about half the size", choices=("none", "lz4", "zstd")),
        Option("write.shuffle_partitions", int, 0,
               "Spark tasks of a write's shuffle, and of each stage of a write that reads Parquet files itself "
               "(0: Spark's default parallelism, one task per core)", minimum=0),
        Option("write.conflict_retries", int, 5,
               "a write that loses to a concurrent one (a ConflictError: it committed first to the same file groups, "
               "or stored the same new key) runs again, up to this many times, from a new snapshot, before the "
               "error reaches the caller; a ClusteringConflict and a write from a RecordBatchReader (read once) are "
               "not retried. In the chaos run (benchmarks/chaos.py, 3 writers on overlapping keys) copy-on-write "
               "writers failed 43% of their writes without it", minimum=0),
        Option("write.count_updates", bool, True,
               "an upsert tells inserted rows from updated ones; on a merge-on-read table with a bucket index that "
               "means reading the keys of every file group it writes to, half of an SF 1 upsert's time and 3/4 of "
               "SF 10's (docs/design-notes.md). false: such an upsert appends its logs without reading them, as "
               "Hudi's does, and counts those rows as upserted"),
        Option("write.spark_one_task_bytes", int, 128 << 20,
               "a Spark write whose input Spark's optimizer estimates at this many bytes or fewer (a Parquet file's "
               "size, local data's size) is written by one task, in threads, without a shuffle (0: never)",
               minimum=0),
        Option("heartbeat.interval_s", float, 5.0, "how often an inflight writer refreshes its heartbeat",
               minimum=0.01),
        Option("heartbeat.tolerable_misses", int, 6,
               "a heartbeat older than interval * misses marks the writer dead", minimum=1),
    ]
}


METADATA_PREFIXES = ("metadata.", "heartbeat.", "lock.")  # the options a data table hands its metadata table


def resolve(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults overlaid with `options`; unknown keys and bad values raise ConfigError."""
    resolved = {name: o.default for name, o in OPTIONS.items()}
    for name, value in (options or {}).items():
        if name not in OPTIONS:
            valid = "\n  ".join(f"{o.name} ({o.type.__name__}, default {o.default!r}): {o.doc}" for o in OPTIONS.values())
            raise ConfigError(f"unknown option {name!r}; valid options:\n  {valid}")
        resolved[name] = OPTIONS[name].check(value)
    return resolved


SECONDARY_INDEX_PREFIX = "secondary_index_"  # a secondary index's metadata partition: the prefix, then its name


def secondary_partition(index_name: str) -> str:
    """The metadata partition of secondary index `index_name`."""
    return SECONDARY_INDEX_PREFIX + index_name


def secondary_index_name(partition: str) -> str | None:
    """The secondary index a metadata partition holds, None for other partitions."""
    return partition[len(SECONDARY_INDEX_PREFIX):] if partition.startswith(SECONDARY_INDEX_PREFIX) else None


def file_groups(partition: str, options: Mapping[str, Any] | None = None) -> int:
    """How many file groups a metadata partition gets (`metadata.<partition>.file_groups`)."""
    name = f"metadata.{'secondary_index' if secondary_index_name(partition) is not None else partition}.file_groups"
    if name not in OPTIONS:
        raise ConfigError(f"unknown metadata partition {partition!r}: no option {name}")
    return OPTIONS[name].check((options or {}).get(name, OPTIONS[name].default))
