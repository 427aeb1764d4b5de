"""Reading a data file slice: its base (Parquet) merged with its logs."""
from __future__ import annotations

import functools
from typing import Collection, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from indexes.arrow_buffers import string_buffers

from metatable.errors import CorruptFileError, naming_damage
from metatable.file_group.file_slice import FileSlice
from metatable.file_group.record_merge import SEQ_COLUMN, merge_each, merge_versions, survivors
from metatable.formats.data_log import read_data_log
from metatable.formats.key_pages import (ParquetFooter, footer_fields, key_pages, parquet_footer, tail_of,
                                         too_many_to_probe, worth_probing)
from metatable.formats.row_pages import read_rows_of_keys
from metatable.parallel import arrow_threads, thread_map
from metatable.schema_evolution import in_schema
from metatable.storage.base import Storage
from metatable.storage.cache import SizedCache
from metatable.storage.paths import TablePaths
from metatable.table_config import DELETED_COLUMN, KEY_COLUMN, TableConfig

_REPEATED = 2  # a Parquet schema element's repetition type


def base_path(paths: TablePaths, fs: FileSlice) -> str | None:
    return paths.file(fs.partition, fs.base.file_name) if fs.base else None


def read_base(storage: Storage, path: str, schema: pa.Schema | None = None, columns: Sequence[str] | None = None,
              known: Collection[str] | None = None) -> pa.Table:
    """A base file, read whole (or `columns` of it), its pages' checksums verified: a damaged or missing file
    is an error naming it. Into `schema` when given: only its columns are read; columns the file lacks (added
    since it was written) are nulls, narrower ones are cast up. `ParquetFile.read` skips the dataset layer
    of `pq.read_table` (the 7 base files of SF 0.01: 20.5 -> 15.3 ms warm). `known`: the columns the file
    may hold (default: the schema's; a table whose schema changed: `known_columns`). On an object store the
    footer is one ranged request (`parquet_footer`, cached) and the column chunks one more per row group
    (`pre_buffer` coalesces them)."""
    with naming_damage(path):
        file, read, wanted = _opened(storage, path, schema, columns, known)
        rows = file.read(columns=read, use_threads=arrow_threads())
        return rows if wanted is None else in_schema(rows, wanted)


def base_batches(storage: Storage, path: str, schema: pa.Schema, known: Collection[str] | None = None,
                 rows: int = 1 << 16) -> Iterator[pa.Table]:
    """A base file's rows as `read_base` reads them into `schema`, `rows` at a time: a reader whose memory must
    not grow with the file (an index build reads every row of the table; a base file holds one row group)."""
    with naming_damage(path):
        file, read, wanted = _opened(storage, path, schema, None, known)
        for batch in file.iter_batches(batch_size=rows, columns=read):
            rows = pa.Table.from_batches([batch])
            yield rows if wanted is None else in_schema(rows, wanted)


def _opened(storage: Storage, path: str, schema: pa.Schema | None, columns: Sequence[str] | None,
            known: Collection[str] | None) -> tuple[pq.ParquetFile, list[str] | None, pa.Schema | None]:
    """A base file checked and opened: the columns to read (None: all) and the schema to read them into."""
    check_footer(storage, path, known if known is not None else schema.names if schema is not None else None)
    footer = parquet_footer(storage, path)
    file = parquet_file(storage, path, footer)
    wanted = schema if schema is None or columns is None else pa.schema([schema.field(c) for c in columns])
    if wanted is None:
        return file, None if columns is None else list(columns), None
    present = footer.column_names
    read = [n for n in wanted.names if n in present]
    return file, None if tuple(read) == present else read, wanted  # None: no column paths to resolve


@footer_fields
def check_footer(storage: Storage, path: str, known: Collection[str] | None) -> None:
    """What page checksums cannot cover, the footer, checked where it can be: a flipped bit in a column name
    reads as a column of nulls, one in a row count drops rows (measured: the two kinds of silent damage left
    when every byte of a base file was flipped in turn). Every flat column of a row group must hold exactly
    its rows, and the file's count be theirs. The footer is decoded by `thrift_compact`: pyarrow's metadata
    accessors abort the process on some damaged footers (a C++ exception thrown through a destructor). Footer
    bytes this process wrote (`written_here`) are not decoded: they are as its writer made them."""
    parsed = parquet_footer(storage, path)
    if parsed.written_here:
        return
    footer = parsed.fields
    elements = footer.get(2, [])
    names, leaves, nested, i = [], 0, False, 1
    while i < len(elements):  # the root's children, each with its subtree
        top = elements[i]
        names.append(top.get(4, b"").decode("utf-8", "replace"))
        width, i = _subtree(elements, i)
        leaves += width[0]
        nested |= width[1]
    if known is not None and (unknown := set(names) - set(known)):
        raise CorruptFileError(path, f"it has columns {sorted(unknown)} that the table does not: its footer is damaged")
    total = 0
    for g, group in enumerate(footer.get(4, [])):
        rows = group.get(3, 0)
        total += rows
        counts = [chunk.get(3, {}).get(5) for chunk in group.get(1, [])]
        if len(counts) != leaves or (not nested and any(c != rows for c in counts)):
            raise CorruptFileError(path, f"row group {g} says {rows} rows and its columns hold {counts}: its footer "
                                         "is damaged")
    if total != footer.get(3):
        raise CorruptFileError(path, f"the footer says {footer.get(3)} rows and its row groups {total}: it is damaged")


def _subtree(elements: list[dict], i: int) -> tuple[tuple[int, bool], int]:
    """(leaves under element i, whether any is repeated or nested) and the index after its subtree."""
    element = elements[i]
    children = element.get(5, 0)
    if not children:
        return (1, element.get(3) == _REPEATED), i + 1
    leaves, nested, i = 0, True, i + 1
    for _ in range(children):
        (width, _), i = _subtree(elements, i)
        leaves += width
    return (leaves, nested), i


def base_metadata(storage: Storage, path: str) -> pq.FileMetaData:
    """pyarrow's view of a base file's footer (`ParquetFooter.metadata`: no request once the footer was read)."""
    with naming_damage(path):
        return parquet_footer(storage, path).metadata


def parquet_file(storage: Storage, path: str, footer: ParquetFooter | None = None) -> pq.ParquetFile:
    """A base file for pyarrow's reader, its footer and size known (`parquet_footer`): on an object store only
    the column chunks are requested, a row group's in one request (`pre_buffer`)."""
    footer = footer or parquet_footer(storage, path)
    return pq.ParquetFile(storage.open_input(path, footer.size, tail_of(storage, path)), metadata=footer.metadata,
                          page_checksum_verification=True, pre_buffer=not storage.local)


def log_tables(storage: Storage, paths: TablePaths, config: TableConfig, fs: FileSlice,
               columns: Sequence[str]) -> list[pa.Table]:
    log_schema = config.log_schema
    schema = pa.schema([log_schema.field(c) for c in columns])
    return [log_columns(storage, paths.file(fs.partition, lf.file_name), schema) for lf in fs.logs]


def log_columns(storage: Storage, path: str, schema: pa.Schema) -> pa.Table:
    """A log's rows in `schema`, kept in this process (by the file's content version: a file changed in place
    is read again). Every write into a file group reads the keys of its logs: the workload benchmark's
    batches, 480 file groups each, read one log more per group each time (1.7-2.5 s for the first batch
    after a compaction, 2.4-4.3 s for the fourth); kept (a new log is put here by its writer,
    `keep_log_columns`), a writer in the same process reads none of them again. One entry per file: a kept
    block that has every field of `schema` answers for any of its columns."""
    key = (storage, path, content_version(storage, path))
    kept = _LOG_COLUMNS.get(key)
    if kept is not None and kept.schema.equals(schema):  # a whole block asked for whole: no field by field
        return kept
    if kept is not None and all((i := kept.schema.get_field_index(f.name)) >= 0 and kept.schema.field(i).equals(f)
                                for f in schema):
        return kept.select(schema.names)
    rows = read_data_log(storage, path, schema)[1]
    _LOG_COLUMNS.put(key, rows)
    return rows


_LOG_COLUMNS: SizedCache[pa.Table] = SizedCache(256 << 20, pa.Table.get_total_buffer_size)


def content_version(storage: Storage, path: str) -> str:
    """What the caches here key a file by besides its path; a missing file is named as a read would name it."""
    with naming_damage(path):
        return storage.content_version(path)


def read_slice(storage: Storage, paths: TablePaths, config: TableConfig, fs: FileSlice | None,
               read_optimized: bool = False) -> pa.Table:
    """Every live row of the slice in the storage schema (base only when `read_optimized`)."""
    return read_slices(storage, paths, config, [fs] if fs else [], read_optimized)


MERGED_TOGETHER = 32  # file slices a read or compaction task merges at once, at most
MERGED_ROWS = 1 << 17  # and the base rows they may hold: a slice larger than a few thousand rows gains nothing


def read_slices(storage: Storage, paths: TablePaths, config: TableConfig, slices: Sequence[FileSlice],
                read_optimized: bool = False) -> pa.Table:
    """Every live row of the slices together, as `read_each` reads them."""
    each = [rows for group in read_each(storage, paths, config, slices, read_optimized) for rows in group]
    return pa.concat_tables(each) if len(each) > 1 else each[0] if each else config.storage_schema.empty_table()


def read_each(storage: Storage, paths: TablePaths, config: TableConfig, slices: Sequence[FileSlice],
              read_optimized: bool = False, budget: int = MERGED_ROWS) -> Iterator[list[pa.Table]]:
    """Every live row of each slice in the storage schema (base only when `read_optimized`), a list per
    group of slices in their order: the slices with logs of a group are merged at once (`merge_each`: a read
    or a compaction of many small slices pays each merge step once), and a group closes once its bases hold
    `budget` rows, so that a reader holds no more than that and one slice."""
    schema = config.storage_schema
    group: list[list[pa.Table]] = []
    held = 0
    for fs in slices:
        path = base_path(paths, fs)
        base = read_base(storage, path, schema, known=config.known_columns) if path else schema.empty_table()
        logs = [] if read_optimized or not fs.logs else log_tables(storage, paths, config, fs, config.log_schema.names)
        group.append([base, *logs])
        held += base.num_rows
        if held >= budget:
            yield merge_each(group, config.ordering_field, schema)
            group, held = [], 0
    if group:
        yield merge_each(group, config.ordering_field, schema)


def task_size(slices: int, threads: int) -> int:
    """How many of `slices` file slices a task of `threads` reads and merges at once: up to MERGED_TOGETHER,
    with at least four tasks a thread, so that large slices still spread over the threads."""
    return min(MERGED_TOGETHER, max(1, slices // (4 * threads)))


_INT_TYPES = (1, 2)  # Parquet's INT32 and INT64 physical types


@footer_fields
def int_column_max(storage: Storage, path: str, column: str) -> int | None:
    """The greatest value of a plain INT32 or INT64 column of a base file, as its footer's statistics store it
    (the physical value: a date's days, a timestamp's units); None where the footer does not say."""
    footer = parquet_footer(storage, path).fields
    elements = footer.get(2, [])
    i, leaf = 1, 0
    while i < len(elements):
        (width, nested), after = _subtree(elements, i)
        if elements[i].get(4, b"").decode("utf-8", "replace") == column:
            break
        leaf, i = leaf + width, after
    else:
        return None
    if nested:
        return None
    best = None
    for group in footer.get(4, []):
        meta = group.get(1, [])[leaf].get(3, {})
        stats = meta.get(12, {})
        raw = stats.get(5, stats.get(1))  # max_value, or the older max (signed: right for integers)
        if meta.get(1) not in _INT_TYPES or (raw is None and stats.get(3) != group.get(3)):
            return None  # not an integer column, or no max for a row group that has values
        if raw is not None:
            value = int.from_bytes(raw, "little", signed=True)
            best = value if best is None else max(best, value)
    return best


def stored_values(storage: Storage, paths: TablePaths, config: TableConfig, fs: FileSlice | None, keys: pa.Array,
                  column: str, above: int | None = None, logs: Sequence[pa.Table] | None = None) -> pa.ChunkedArray:
    """`column` of each key's live row in the slice (null for a key it lacks), as `stored_columns` reads it.
    `above`: the caller needs no value at or below it (an integer as Parquet stores the column), so a base
    whose footer says none is above is not read, and log rows at or below it are dropped before the merge: a
    key whose newest version is one of them reads as null. New rows' ordering values are usually the
    greatest: upserts into a merge-on-read table of 1M rows in 8 file groups, with a log each, cost 53 -> 119
    ms (100 rows) and 154 -> 346 ms (100k rows) to count what lost, reading everything; 50 -> 55 ms and 165
    -> 188 ms so (medians of 5, alternated). `logs`: the slice's log blocks already read (key, `column`,
    delete flag)."""
    field = config.storage_schema.field(column)
    if fs is None:
        return pa.chunked_array([pa.nulls(len(keys), field.type)])
    path = base_path(paths, fs)
    with_base = not (path and above is not None and (most := int_column_max(storage, path, column)) is not None
                     and most <= above)
    if logs is None:
        logs = log_tables(storage, paths, config, fs, [KEY_COLUMN, column, DELETED_COLUMN]) if fs.logs else []
    if above is not None:  # a version at or below it changes no answer the caller needs; deletes stay
        bound = pa.scalar(above, pa.int32() if pa.types.is_date32(field.type) else pa.int64()).cast(field.type)
        limit = bound.as_py()
        if not (path and with_base) and all((most := pc.max(t[column]).as_py()) is None or most <= limit
                                            for t in logs):
            return pa.chunked_array([pa.nulls(len(keys), field.type)])  # the usual case: no array work at all
        logs = [t.filter(pc.or_(t[DELETED_COLUMN], pc.fill_null(pc.greater(t[column], bound), False)))
                for t in logs]
    merged = stored_columns(storage, paths, config, fs, keys, [column], logs, with_base,
                            column if column == config.ordering_field else None)
    return merged[column]


def stored_columns(storage: Storage, paths: TablePaths, config: TableConfig, fs: FileSlice | None, keys: pa.Array,
                   columns: Sequence[str], logs: Sequence[pa.Table] | None = None, with_base: bool = True,
                   ordering: str | None = None) -> pa.Table:
    """`columns` of each key's live row in the slice, a row per key in `keys`' order (nulls for a key it
    lacks): the base's rows of the keys, read page by page where the file has a key page index and the keys
    are few next to its pages (as `get` does), else the key and those columns whole; then the logs merged on
    top. `logs`: the slice's log blocks already read (key, `columns`, delete flag); `ordering`: the ordering
    field where it is among `columns` (else the newest version wins). No slice (the index placed keys in a
    file group this writer's snapshot does not have yet: the chaos soak found it, a record index current to
    a clustering that completed after the write began): nulls."""
    storage_schema = config.storage_schema
    schema = pa.schema([(KEY_COLUMN, pa.string()), *[storage_schema.field(c) for c in columns]])
    if fs is None:
        return pa.table([keys, *[pa.nulls(len(keys), f.type) for f in schema][1:]], schema=schema)
    path = base_path(paths, fs) if with_base else None
    base = schema.empty_table()
    if path:
        rows = read_rows_of_keys(storage, [path], [keys], schema.names)[0] \
            if worth_probing(storage, path, len(keys)) else None
        if rows is None:
            rows = read_base(storage, path, storage_schema, schema.names, config.known_columns)
        base = pa.table([rows[f.name].cast(f.type) for f in schema], schema=schema)
        base = base.filter(pc.is_in(base[KEY_COLUMN], value_set=keys))
    if logs is None:
        logs = log_tables(storage, paths, config, fs, [*schema.names, DELETED_COLUMN]) if fs.logs else []
    logs = [log.select([*schema.names, DELETED_COLUMN]) for log in logs]
    logs = [t.filter(pc.is_in(t[KEY_COLUMN], value_set=keys)) for t in logs if t.num_rows]
    if not base.num_rows and not any(t.num_rows for t in logs):  # the usual case of `stored_values`' bound
        return pa.table([keys, *[pa.nulls(len(keys), f.type) for f in schema][1:]], schema=schema)
    merged = merge_versions([base, *logs], ordering, schema)
    found = pc.index_in(keys, value_set=merged[KEY_COLUMN].combine_chunks())
    return pa.table([keys, *[merged[c].take(found) for c in columns]], schema=schema)


def members(candidates: pa.Array | pa.ChunkedArray, big: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Which candidates occur in `big`. Measured: hashing the few candidates and probing the many is
    ~6x faster than `is_in(candidates, value_set=big)`, which hashes all of `big`."""
    if len(big) == 0 or len(candidates) == 0:
        return np.zeros(len(candidates), dtype=bool)
    hits = big.filter(pc.is_in(big, value_set=candidates))
    return pc.is_in(candidates, value_set=hits).to_numpy(zero_copy_only=False)


class SortedKeys:
    """A base file's record keys as sorted fixed-width bytes, for membership by binary search. A tagger on
    Spark sees a batch in Arrow batches of 10k rows and probes the same base files for each: hashing a whole
    column per probe (`members`) cost 0.03 s a file each time, a search here costs a millisecond after the
    keys are laid out once (base files are written sorted, so that is a copy, not a sort). Fixed-width bytes
    cannot tell a trailing NUL from padding, so keys with a NUL are scanned instead."""

    def __init__(self, column: pa.Array | pa.ChunkedArray) -> None:
        self.scanned = column if pc.any(pc.match_substring(column, "\0")).as_py() else None
        keys = fixed_width(column) if self.scanned is None else fixed_width(pa.array([], pa.string()))
        self.keys = keys if bool(np.all(keys[1:] >= keys[:-1])) else np.sort(keys)

    def contains(self, candidates: pa.Array | pa.ChunkedArray) -> np.ndarray:
        if self.scanned is not None:
            return members(candidates, self.scanned)
        probe = fixed_width(candidates)
        pos = np.searchsorted(self.keys, probe)
        hit = pos < len(self.keys)
        hit[hit] = self.keys[pos[hit]] == probe[hit]
        with_nul = pc.match_substring(candidates, "\0")
        return hit & ~pc.fill_null(with_nul, False).to_numpy(zero_copy_only=False) if pc.any(with_nul).as_py() \
            else hit


class ProbedKeys:
    """A fixed set of keys (a base file's key column, a slice's log keys) that may be probed many times. A
    probe hashes the candidates and scans the set (`members`, ~0.03 s for 915k keys); after a few probes the
    set is laid out sorted (`SortedKeys`, 0.04-0.05 s once) and later probes are binary searches (~1 ms for
    1.4k candidates). A write in-process probes each set 1-3 times (its lookup, then keys only logs know),
    where sorting at the second probe took the SF 1 bloom upsert from 1.85 to 3.1 s; a tagger on Spark
    probes once per Arrow batch of 10k rows, 15 times a file in that upsert."""

    SORT_AFTER = 3  # probes

    def __init__(self, keys: pa.Array | pa.ChunkedArray) -> None:
        self.keys = keys
        self.probes = 0
        self.sorted: SortedKeys | None = None

    def contains(self, candidates: pa.Array | pa.ChunkedArray) -> np.ndarray:
        self.probes += 1
        if self.sorted is None and self.probes > self.SORT_AFTER:
            self.sorted = SortedKeys(self.keys)
        return members(candidates, self.keys) if self.sorted is None else self.sorted.contains(candidates)


def fixed_width(strings: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """UTF-8 strings as a numpy bytes array (`S<longest>`), which orders like Arrow's string sort, built from
    Arrow buffers without a Python string per key: ASCII keys (the usual) are NUL-padded by Arrow and viewed
    in place, 0.06 s for 915k keys; others are laid out one byte position at a time, 0.25 s; through Python
    strings it took 0.39 s."""
    array = strings.combine_chunks() if isinstance(strings, pa.ChunkedArray) else strings
    array = pc.fill_null(array.cast(pa.string()), "")
    n = len(array)
    width = max(pc.max(pc.binary_length(array)).as_py() or 0, 1)
    if pc.all(pc.string_is_ascii(array)).as_py() is not False:
        padded = pc.ascii_rpad(array, width, padding="\0")
        start = int(np.frombuffer(padded.buffers()[1], np.int32)[padded.offset]) if n else 0
        return np.frombuffer(padded.buffers()[2] or b"", np.uint8)[start:start + n * width].view(f"S{width}")
    offsets, data = string_buffers(array)
    starts, lengths = offsets[:-1], np.diff(offsets)
    out = np.zeros((n, width), np.uint8)
    for j in range(width):
        rows = np.flatnonzero(lengths > j)
        out[rows, j] = data[starts[rows] + j]
    return out.view(f"S{width}").reshape(n)


def base_keys_present(storage: Storage, path: str, candidates: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """Which candidates the base file holds, and the bytes read to tell: on an object store from its key
    column where this process holds it already (a 1,000-row upsert after a large one probed 6 files' pages in
    12 requests; on a file system probing a page is cheaper than matching a whole column), else one key page
    per candidate when the file has a key page index and the candidates are few next to its pages, else from
    the key column."""
    held = None if storage.local else held_key_column(storage, path)
    if held is not None:
        return members(candidates, held), 0
    if worth_probing(storage, path, pc.count_distinct(candidates).as_py()) and \
            (pages := key_pages(storage, path)) is not None:
        return pages.contains(candidates.to_pylist())
    column, read = key_column(storage, path)
    return members(candidates, column), read


def key_column(storage: Storage, path: str) -> tuple[pa.ChunkedArray, int]:
    """A base file's whole record-key column, and its bytes in the file. Arrow's threads only for several row
    groups: one column chunk decodes on one thread anyway, and the hand-off cost a small file more than the
    read (56 SF 0.01 files: 21 -> 16 ms). The column is kept in this process, by the file's content version
    (a file changed in place is read again; on an object store a name is never rewritten): each upsert into a
    file group that tells updates from inserts read it again, a request per file group on a store (8 of a
    1,000-row upsert's 85 in `benchmarks/object_store.py` at SF 0.01), 0.23 ms a group on a file system (a
    workload-benchmark batch writes 480 groups)."""
    key = (storage, path, content_version(storage, path))
    found = _KEY_COLUMNS.get(key)
    if found is None:
        found = _read_key_column(storage, path)
        _KEY_COLUMNS.put(key, found)
    return found


_KEY_COLUMNS: SizedCache[tuple[pa.ChunkedArray, int]] = SizedCache(
    256 << 20, lambda found: found[0].get_total_buffer_size())


def held_key_column(storage: Storage, path: str) -> pa.ChunkedArray | None:
    """A base file's key column where this process holds it (`key_column`, `keep_key_column`), else None."""
    found = _KEY_COLUMNS.get((storage, path, content_version(storage, path)))
    return None if found is None else found[0]


def _read_key_column(storage: Storage, path: str) -> tuple[pa.ChunkedArray, int]:
    with naming_damage(path), parquet_file(storage, path) as parquet:
        column = parquet.read(columns=[KEY_COLUMN], use_threads=parquet.metadata.num_row_groups > 1)[KEY_COLUMN]
        return column, _key_column_bytes(parquet.metadata)


def _key_column_bytes(metadata: pq.FileMetaData) -> int:
    leaf = [metadata.schema.column(i).path for i in range(len(metadata.schema))].index(KEY_COLUMN)
    return sum(metadata.row_group(i).column(leaf).total_compressed_size for i in range(metadata.num_row_groups))


def keep_key_column(storage: Storage, path: str, keys: pa.ChunkedArray, metadata: pq.FileMetaData) -> None:
    """A base file just written, its key column as `key_column` would read it (`metadata`: the file's, as its
    writer collected it), when that is at most `KEPT_BLOCK_BYTES`, as for logs: the next write into a small
    file group reads those keys (the workload benchmark's batch after a compaction read all 480 new bases':
    1.86-2.11 s, 1.56-1.77 s kept, with `worth_probing` deciding from the footer), and a load's large files
    would take the cache from them. A copy: the keys may be a slice of a larger input, which the cache must
    not hold."""
    if keys.nbytes <= KEPT_BLOCK_BYTES:
        copy = pa.chunked_array([pa.concat_arrays(keys.chunks)] if keys.num_chunks else [], keys.type)
        _KEY_COLUMNS.put((storage, path, content_version(storage, path)), (copy, _key_column_bytes(metadata)))


def log_keys(storage: Storage, paths: TablePaths, config: TableConfig,
             fs: FileSlice) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """What a slice's logs say about existence: the keys they touch, and those alive after them. Kept in this
    process by the logs' paths and content versions, and made from the answer for all logs but the newest
    where that is kept: each write into a file group adds a log, and merging them all again cost a batch of
    the workload benchmark 0.43 of its 2.8 s of file-group writes (480 groups, three logs each)."""
    logs = [paths.file(fs.partition, lf.file_name) for lf in fs.logs]
    versions = tuple((path, content_version(storage, path)) for path in logs)
    found = _LOG_KEYS.get((storage, versions))
    if found is not None:
        return found
    schema = pa.schema([config.log_schema.field(KEY_COLUMN), config.log_schema.field(DELETED_COLUMN)])
    earlier = _LOG_KEYS.get((storage, versions[:-1])) if len(versions) > 1 else None
    if earlier is None:
        found = keys_of_logs([log_columns(storage, path, schema) for path in logs])
    else:
        found = _superseded_by(earlier, log_columns(storage, logs[-1], schema))
    _LOG_KEYS.put((storage, versions), found)
    return found


def keep_log_columns(storage: Storage, path: str, block: pa.Table, also: Sequence[str] = ()) -> None:
    """A log just written, as `log_columns` would read it: the next write into its file group reads its keys
    (480 such reads were 0.24 s of a workload-benchmark batch), a compaction in this process all of it (the
    benchmark's compacting batches, 1,920 logs each: 3.5-4.0 s with only the keys kept, 2.8-3.4 s whole).
    Kept whole up to `KEPT_BLOCK_BYTES`, else its key and delete flag only, and the columns `also` (those its
    commit reads: a secondary index's and the ordering field): a large write's logs would take the cache from
    the small ones'. Sizes here are buffer sizes: a 67-row block read from its file took 44 us
    for `nbytes`, 3 us for `get_total_buffer_size` (which counts a sliced column's whole buffers, as a cache
    holds them)."""
    if block.get_total_buffer_size() > KEPT_BLOCK_BYTES:
        block = block.select(list(dict.fromkeys([KEY_COLUMN, DELETED_COLUMN, *also])))
    _LOG_COLUMNS.put((storage, path, content_version(storage, path)), block)


KEPT_BLOCK_BYTES = 1 << 20
_LOG_KEYS: SizedCache[tuple[pa.ChunkedArray, pa.ChunkedArray]] = SizedCache(
    128 << 20, lambda found: found[0].get_total_buffer_size() + found[1].get_total_buffer_size())


def keys_of_logs(logs: Sequence[pa.Table]) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """`log_keys` of log blocks already read (their key and delete flag at least), oldest first: folded a
    block at a time, each block's answer superseding the earlier ones' for the keys it touches. No merge of
    the versions: the workload benchmark's 480 slices of four logs, 0.9 ms a slice by merging them, 0.3 ms
    so (the keys of a fresh process's first write into them)."""
    found: tuple[pa.ChunkedArray, pa.ChunkedArray] | None = None
    for log in logs:
        found = _superseded_by(found, log)
    return found if found is not None else (pa.chunked_array([], pa.string()), pa.chunked_array([], pa.string()))


def _superseded_by(earlier: tuple[pa.ChunkedArray, pa.ChunkedArray] | None,
                   log: pa.Table) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """`log_keys` of the logs that gave `earlier`, then `log`: its keys are alive where it holds a row of them
    (in one write a key's delete comes before its row, `record_merge`), the earlier answer stands for the
    others."""
    touched = log[KEY_COLUMN]
    alive = touched.filter(pc.invert(log[DELETED_COLUMN])) if pc.any(log[DELETED_COLUMN]).as_py() else touched
    if earlier is None:
        return touched, alive
    kept = earlier[1].filter(pc.invert(pc.is_in(earlier[1], value_set=touched.combine_chunks())))
    return (pa.chunked_array([*earlier[0].chunks, *touched.chunks], pa.string()),
            pa.chunked_array([*kept.chunks, *alive.chunks], pa.string()))


def live_mask(storage: Storage, paths: TablePaths, config: TableConfig, fs: FileSlice | None,
              candidates: pa.Array | pa.ChunkedArray, in_base: np.ndarray | None = None,
              in_logs: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Which candidate keys are live in the slice. Only the logs (small) are merged; the base's key
    column (large) is only probed: live = live in the logs, or in the base and not deleted by the logs.
    `in_base` saves the probe when the caller knows the base's answer (a cached key index), `in_logs` the
    log reads when it knows which candidates the logs touch and which they leave alive (`log_keys`)."""
    n = len(candidates)
    if fs is None:
        return np.zeros(n, dtype=bool)
    path = base_path(paths, fs)
    if in_base is None:
        in_base = base_keys_present(storage, path, candidates)[0] if path else np.zeros(n, dtype=bool)
    if not fs.logs:
        return in_base
    if in_logs is None:
        touched, alive = log_keys(storage, paths, config, fs)
        in_logs = members(candidates, touched), members(candidates, alive)
    touched_mask, alive_mask = in_logs
    return np.where(touched_mask, alive_mask, in_base)


def live_in_slices(storage: Storage, paths: TablePaths, config: TableConfig, slices: Sequence[FileSlice | None],
                   candidates: pa.Array | pa.ChunkedArray, owners: np.ndarray) -> np.ndarray:
    """`live_mask` of many slices at once: which candidates are live in their own slice, `slices[owners[i]]`
    (None: a file group with nothing yet). A key and its slice are paired as one integer (the slice's number
    times the candidates' distinct keys, plus the key's place among them), so the slices' base keys and log
    rows are matched in a few Arrow calls over all of them instead of a few per slice: per slice they were
    ~20 calls of ~50 us, 0.75 of the ~1.9 ms a merge-on-read file group's write took in the workload
    benchmark's batches (480 groups), and two writer threads were no faster than one (each holds the GIL).
    Slices are matched together until their bases hold `MATCHED_KEYS` keys or they are asked about
    `MATCHED_CANDIDATES`, and such batches are read and matched on `THREADS` threads, as the writer threads
    of one group at a time read their groups' keys: one after another, SF 1's 5% upsert took 0.9 s here (of
    1.7 s), 0.43 of it reading 56 key columns. A base whose pages `worth_probing` says to probe (few
    candidates in a large file) is asked alone."""
    return _live(storage, paths, config, slices, candidates, owners, ())[0]


def live_rows_in_slices(storage: Storage, paths: TablePaths, config: TableConfig,
                        slices: Sequence[FileSlice | None], candidates: pa.Array | pa.ChunkedArray,
                        owners: np.ndarray, columns: Sequence[str]) -> tuple[np.ndarray, pa.Table]:
    """`live_in_slices`, and `columns` of each live candidate's row in its slice, with the ordering field that
    chooses among its versions (a row per candidate, nulls where it is not live): the base's columns are read
    beside its keys, and a log's with its key column, so the rows come at the price of the columns' decoding
    (a write's secondary index entries need the values its keys had)."""
    return _live(storage, paths, config, slices, candidates, owners, tuple(columns))


def _live(storage: Storage, paths: TablePaths, config: TableConfig, slices: Sequence[FileSlice | None],
          candidates: pa.Array | pa.ChunkedArray, owners: np.ndarray,
          columns: tuple[str, ...]) -> tuple[np.ndarray, pa.Table | None]:
    owners = np.asarray(owners, dtype=np.int64)
    live = np.zeros(len(candidates), dtype=bool)
    ordering = config.ordering_field if columns else None
    if ordering is not None and ordering not in columns:  # the rows' versions are chosen by it
        columns = (*columns, ordering)
    value_schema = pa.schema([config.storage_schema.field(c) for c in columns])
    values: list[tuple[np.ndarray, pa.Table]] = []  # (candidate rows, their columns)
    counts = np.bincount(owners, minlength=len(slices))
    asking = np.split(np.argsort(owners, kind="stable"), np.cumsum(counts)[:-1])  # each slice's candidates
    alone: list[int] = []
    batches: list[list[tuple[int, pa.ChunkedArray | None]]] = [[]]  # (slice, its base keys where held)
    held = asked = 0
    for i, fs in enumerate(slices):
        if fs is None or not counts[i]:
            continue
        path = base_path(paths, fs)
        keys = held_key_column(storage, path) if path is not None else None
        rows = 0 if path is None else len(keys) if keys is not None else parquet_footer(storage, path).fields[3]
        if path is not None and (keys is None or not too_many_to_probe(int(counts[i]), rows)) and \
                worth_probing(storage, path, int(counts[i])):  # the footer says: its pages, not its keys
            alone.append(i)
            continue
        if batches[-1] and (held + rows > MATCHED_KEYS or asked >= MATCHED_CANDIDATES):
            batches.append([])
            held = asked = 0
        batches[-1].append((i, keys))
        held += rows
        asked += int(counts[i])

    def probe(i: int) -> None:
        mine = candidates.take(asking[i])
        found = live_mask(storage, paths, config, slices[i], mine)
        live[asking[i]] = found
        if columns:
            rows = stored_columns(storage, paths, config, slices[i], mine.filter(pa.array(found)), columns,
                                  ordering=ordering)
            values.append((asking[i][found], rows.drop_columns([KEY_COLUMN])))

    def match(batch: list[tuple[int, pa.ChunkedArray | None]]) -> None:
        together = []
        for i, keys in batch:
            fs = slices[i]
            path = base_path(paths, fs)
            if keys is None and path is not None:
                keys = key_column(storage, path)[0]
            base = read_base(storage, path, value_schema, known=config.known_columns) \
                if columns and path is not None else None
            together.append((i, keys, base, [log_columns(storage, paths.file(fs.partition, lf.file_name), schema)
                                             for lf in fs.logs]))
        rows = np.concatenate([asking[i] for i, _ in batch])
        found, rows_found = _match(together, candidates.take(rows), owners[rows], value_schema, ordering)
        live[rows] = found  # the rows of its own slices
        if rows_found is not None:
            values.append((rows[found], rows_found))

    log_fields = [config.log_schema.field(c) for c in (KEY_COLUMN, DELETED_COLUMN, *columns)]
    schema = pa.schema(log_fields)
    work = [functools.partial(probe, i) for i in alone] + [functools.partial(match, b) for b in batches if b]
    thread_map(lambda step: step(), work)
    if not columns:
        return live, None
    at = np.full(len(candidates), -1, np.int64)  # each candidate's row among the values found
    at[np.concatenate([rows for rows, _ in values]) if values else np.zeros(0, np.int64)] = \
        np.arange(sum(len(rows) for rows, _ in values))
    found = pa.concat_tables([t for _, t in values]) if values else value_schema.empty_table()
    return live, found.take(pa.array(at, mask=at < 0))


MATCHED_KEYS = 1 << 21  # base keys a batch of `live_in_slices` matches (~30 MB of short keys; one per thread)
# candidates a batch of `live_in_slices` matches: each base key is looked up among them, a table that stays in
# the cache, and a large upsert makes many batches for the threads
MATCHED_CANDIDATES = 1 << 14


def _match(together: Sequence[tuple[int, pa.ChunkedArray | None, pa.Table | None, Sequence[pa.Table]]],
           mine: pa.Array | pa.ChunkedArray, owners: np.ndarray, value_schema: pa.Schema,
           ordering: str | None) -> tuple[np.ndarray, pa.Table | None]:
    """`live_in_slices` for the candidates `mine` of these slices (each its number, base keys, base columns of
    `value_schema` where asked, and log blocks), `owners[j]` the slice of `mine[j]`: whether each is live
    there, and where asked the columns of the live ones' rows (in their order; `ordering`: the table's ordering
    field, among those columns)."""
    names = pc.unique(mine)
    width = max(len(names), 1)
    wanted = owners * width + _codes(mine, names)
    bases = [(i, keys) for i, keys, _, _ in together if keys is not None]
    base_rows, base_pairs = _paired([keys for _, keys in bases], [i for i, _ in bases], names, width)
    in_base = np.isin(wanted, base_pairs)
    blocks = [(i, block) for i, _, _, logs in together for block in logs]
    log_rows, log_pairs = _paired([b.column(KEY_COLUMN) for _, b in blocks], [i for i, _ in blocks], names, width)
    # a key's newest row in its slice's logs says whether it lives (in one write its delete comes first)
    touched, last = np.unique(log_pairs[::-1], return_index=True)
    newest = log_rows[::-1][last]  # the newest log row of each touched pair
    deleted = np.concatenate([b.column(DELETED_COLUMN).to_numpy() for _, b in blocks]) if blocks \
        else np.zeros(0, bool)
    alive = touched[~deleted[newest]]
    in_logs = np.isin(wanted, touched)
    live = np.where(in_logs, np.isin(wanted, alive), in_base)
    if not len(value_schema):
        return live, None
    # the live candidates' rows: the base's where no log touches the key, else the version the table's merge
    # rule keeps (the newest log row, or with an ordering field the greatest after the last delete)
    base_values = pa.concat_tables([in_schema(t, value_schema) for _, keys, t, _ in together
                                    if keys is not None]) if bases else value_schema.empty_table()
    log_values = pa.concat_tables([in_schema(b.select(value_schema.names), value_schema) for _, b in blocks]) \
        if blocks else value_schema.empty_table()
    from_logs, from_base = wanted[live & in_logs], wanted[live & ~in_logs]
    by_pair = np.argsort(base_pairs)

    def base_row(pairs: np.ndarray) -> np.ndarray:
        return base_rows[by_pair[np.searchsorted(base_pairs, pairs, sorter=by_pair)]]

    if ordering is None:
        log_source = base_values.num_rows + newest[np.searchsorted(touched, from_logs)]
    else:
        picked = np.isin(log_pairs, from_logs)
        rows, pairs = log_rows[picked], log_pairs[picked]
        block_of = np.repeat(np.arange(len(blocks)), [b.num_rows for _, b in blocks])
        stored = from_logs[np.isin(from_logs, base_pairs)]
        at_base = base_row(stored)
        versions = pa.table({KEY_COLUMN: np.concatenate([stored, pairs]),
                             DELETED_COLUMN: np.concatenate([np.zeros(len(stored), bool), deleted[rows]]),
                             SEQ_COLUMN: np.concatenate([np.zeros(len(stored), np.int64), block_of[rows] + 1]),
                             ordering: pa.concat_arrays([base_values[ordering].take(at_base).combine_chunks(),
                                                         log_values[ordering].take(rows).combine_chunks()]),
                             "source": np.concatenate([at_base, base_values.num_rows + rows])})
        kept = survivors(versions, ordering)  # one row per live key, in key order
        log_source = kept["source"].to_numpy()[np.searchsorted(kept[KEY_COLUMN].to_numpy(), from_logs)]
    source = np.empty(int(live.sum()), np.int64)  # each live candidate's row among base values, then log values
    live_logs = in_logs[live]
    source[~live_logs] = base_row(from_base)
    source[live_logs] = log_source
    return live, pa.concat_tables([base_values, log_values]).take(pa.array(source))


def _codes(keys: pa.Array | pa.ChunkedArray, names: pa.Array) -> np.ndarray:
    """Each key's place in `names`, -1 where it is not there."""
    return pc.fill_null(pc.index_in(keys, value_set=names), -1).to_numpy().astype(np.int64, copy=False)


def _paired(columns: Sequence[pa.ChunkedArray], owners: Sequence[int], names: pa.Array,
            width: int) -> tuple[np.ndarray, np.ndarray]:
    """Of the keys in `columns` (column j of slice `owners[j]`), in order: the numbers of those among `names`,
    and their pairs (`live_in_slices`)."""
    if not columns:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    codes = _codes(pa.chunked_array([c for column in columns for c in column.chunks], names.type), names)
    rows = np.flatnonzero(codes >= 0)
    owner = np.repeat(np.asarray(owners, np.int64), [len(column) for column in columns])
    return rows, owner[rows] * width + codes[rows]
