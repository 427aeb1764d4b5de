"""Running a write task's Arrow functions: tag every row, then write each file group as its rows stream by.

The same functions run in-process for a pyarrow input (`run_local`) and inside Spark's Arrow stages
(`spark_write`), so a write needs Spark only for scale and commits the same files either way.
"""
from __future__ import annotations

import os
import shutil
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from indexes.arrow_keys import pair_codes, pair_groups
from indexes.assigner import Assignment

from metatable.arrow_memory import bulk_memory
from metatable.commit.stored_rows import GROUP, HELD, StoredRows
from metatable.config import THREADS
from metatable.file_group.base_file import new_write_token
from metatable.file_group.markers import mark_all
from metatable.file_group.slice_reader import live_in_slices, live_rows_in_slices
from metatable.file_group.written import stats_table
from metatable.metadata.table import MetadataTable
from metatable.parallel import worker_pool
from metatable.progress import progress
from metatable.table_config import KEY_COLUMN
from metatable.write.file_group_writer import write_file_group
from metatable.write.key_prefetch import KeyPrefetch
from metatable.write.tagging import Tagger, tag_inputs
from metatable.write.write_input import rechunk
from metatable.write.write_task import FILE_ID_COLUMN, MOVED_OUT_COLUMN, PARTITION_COLUMN, PRESENT_COLUMN, WriteTask


def with_tags(task: WriteTask, rows: pa.Table, keys: pa.Array, assignment: Assignment) -> pa.Table:
    """`rows` with their key, partition path and file group (and whether the key is there already, when the
    index looked it up); rows assigned nowhere are dropped (`WriteTask.placed`). When the
    task moves keys, a row whose key moved partition also goes, flagged `MOVED_OUT_COLUMN`, to the file group
    it moved out of (every row carries the flag, so the chunks of a stream share one schema)."""
    tagged = rows.append_column(KEY_COLUMN, keys).append_column(PARTITION_COLUMN, assignment.partitions) \
        .append_column(FILE_ID_COLUMN, task.placed(assignment.file_ids))
    if task.looks_up_keys:
        tagged = tagged.append_column(PRESENT_COLUMN, assignment.present)
    if task.moves_keys:
        tagged = tagged.append_column(MOVED_OUT_COLUMN, pa.repeat(False, tagged.num_rows))
        if assignment.moved_from is not None:
            old_partitions, old_files = assignment.moved_from
            moved = pc.is_valid(old_files)
            out = tagged.filter(moved)
            out = out.set_column(out.schema.get_field_index(PARTITION_COLUMN), PARTITION_COLUMN,
                                 old_partitions.filter(moved)) \
                .set_column(out.schema.get_field_index(FILE_ID_COLUMN), FILE_ID_COLUMN, old_files.filter(moved)) \
                .set_column(out.schema.get_field_index(MOVED_OUT_COLUMN), MOVED_OUT_COLUMN,
                            pa.repeat(True, out.num_rows))
            tagged = pa.concat_tables([tagged, out])
    return tagged.filter(pc.is_valid(tagged[FILE_ID_COLUMN])) if tagged[FILE_ID_COLUMN].null_count else tagged


def file_group_rows(tagged: pa.Table) -> list[np.ndarray]:
    """The row indices of each file group in `tagged`, in input order."""
    return pair_groups(tagged[PARTITION_COLUMN], tagged[FILE_ID_COLUMN])


def sorted_runs(tagged: pa.Table) -> Iterator[pa.Table]:
    """The runs of equal file groups of rows already sorted by file group (Spark's shuffle sorted them)."""
    if tagged.num_rows == 0:
        return
    codes = pair_codes(tagged[PARTITION_COLUMN], tagged[FILE_ID_COLUMN])
    bounds = [*np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]]).tolist(), len(codes)]
    for start, end in zip(bounds[:-1], bounds[1:]):
        yield tagged.slice(start, end - start)


def write_sorted_batches(task: WriteTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Write a stream of tagged batches sorted by file group, holding one file group's rows at a time."""
    pending: list[pa.Table] = []
    current = None
    for batch in batches:
        for run in sorted_runs(pa.Table.from_batches([batch])):
            key = (run[PARTITION_COLUMN][0].as_py(), run[FILE_ID_COLUMN][0].as_py())
            if key != current and pending:
                yield from stats_table(write_file_group(task, pa.concat_tables(pending))).to_batches()
                pending = []
            current = key
            pending.append(run)
    if pending:
        yield from stats_table(write_file_group(task, pa.concat_tables(pending))).to_batches()


def write_held_batches(task: WriteTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Write a stream of tagged batches in any order (a Spark write task's share): held by file group, and
    spilled past `write.spill_bytes`, as an in-process stream is. A write that is not a load skips Spark's
    sort this way (see `spark_write.run_spark`)."""
    tables = (pa.Table.from_batches([batch]) for batch in batches)
    yield from write_stream(task, tables, task_spill_dir(task)).to_batches()


def write_whole_input(task: WriteTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The whole write of a small Spark input, in the one task that reads it: tagged `write.chunk_rows` rows at
    a time and written as an in-process stream is (see `spark_write.run_spark`)."""
    chunks = rechunk(batches, task.config.options["write.chunk_rows"])
    yield from run_local(task, chunks, task_spill_dir(task)).stats.to_batches()


def task_spill_dir(task: WriteTask) -> str:
    """A Spark write task's own spill directory, under the instant's, which a rollback removes."""
    return os.path.join(task.storage.scratch(task.paths.spill(task.instant)), f"task-{new_write_token()}")


def write_groups(task: WriteTask, groups: Iterable[Callable[[], pa.Table]], total: int,
                 threads: int = THREADS, prefetch: KeyPrefetch | None = None) -> pa.Table:
    """Load and write each file group's rows, `threads` at a time, holding only those groups: taking the rows,
    sorting, Parquet encoding and compression release the GIL. Measured at SF 1 (6M rows, 56 file groups)
    on 2 cores, with the grouping below: 21.7 s for an in-memory load before, 7.9 s after."""
    results: list[dict] = []
    with worker_pool(threads, "metatable-write") as pool:
        pending: deque[Future] = deque()
        for load in progress(groups, f"{task.operation} {task.instant}", total=total):
            pending.append(pool.submit(lambda load=load: write_file_group(task, load(), prefetch)))
            if len(pending) >= threads:
                results += pending.popleft().result()
        for future in pending:
            results += future.result()
    return stats_table(results)


def tag_chunks(task: WriteTask, chunks: Iterable[pa.Table], metadata: MetadataTable | None = None
               ) -> Iterator[pa.Table]:
    """Each chunk with its tags (`with_tags`), by one tagger: a bloom tagger keeps what it fetched. `metadata`:
    the write's own metadata table, where it runs in the write's process (`make_assigner`)."""
    tagger = Tagger(task, metadata)
    inputs = tag_inputs(task.config)
    for chunk in chunks:
        keys, assignment = tagger(chunk.select(inputs))
        # a take from many chunks is slow: 0.46 s against 0.04 s for a 1/56 share of SF 1
        yield with_tags(task, chunk, keys, assignment).combine_chunks()


@dataclass(frozen=True)
class LocalWrite:
    """What a write in this process did: its files' statistics, and the rows its keys had where it read
    them (`with_presence`)."""

    stats: pa.Table
    stored: StoredRows | None = None


def run_local(task: WriteTask, data: pa.Table | Iterable[pa.Table], spill_dir: str | None = None,
              metadata: MetadataTable | None = None) -> LocalWrite:
    """The whole write in this process. `data` is conformed to the table: a Table, or a stream of chunks
    that are tagged one at a time and held by file group in memory up to `write.spill_bytes`; past that,
    they go to `spill_dir`, one file per file group, so that memory holds the budget, two chunks and the
    file groups being written, not the input. `metadata`: the write's own metadata table, where this is the
    write's process (`make_assigner`)."""
    with bulk_memory():
        if isinstance(data, pa.Table):
            rows = next(tag_chunks(task, [data], metadata))
            groups = list(file_group_rows(rows))
            rows, stored = with_presence(task, rows, groups)
            mark_all(task.storage, task.paths, task.instant, rows[PARTITION_COLUMN].unique().to_pylist())
            return LocalWrite(write_groups(task, (partial(rows.take, group) for group in groups), len(groups)),
                              stored)
        return LocalWrite(write_stream(task, tag_chunks(task, data, metadata), spill_dir))


def with_presence(task: WriteTask, tagged: pa.Table, groups: Sequence[np.ndarray]
                  ) -> tuple[pa.Table, StoredRows | None]:
    """`tagged` with whether each row's key lives in its file group's slice (`PRESENT_COLUMN`), where the
    writers would read the slices' keys to learn it (`WriteTask.reads_slice_keys`): read for all the groups at
    once (`live_in_slices`), not group by group. And where the commit wants them (`WriteTask.stored_columns`),
    the rows those keys had there, read with their keys."""
    if not task.reads_slice_keys or not task.slices or PRESENT_COLUMN in tagged.column_names:
        return tagged, None
    owners = np.empty(tagged.num_rows, np.int64)
    slices, names = [], []
    for i, rows in enumerate(groups):
        owners[rows] = i
        first = int(rows[0])
        names.append((tagged[PARTITION_COLUMN][first].as_py(), tagged[FILE_ID_COLUMN][first].as_py()))
        slices.append(task.slices.get(names[-1]))
    columns = task.stored_columns
    if not columns:
        present = live_in_slices(task.storage, task.paths, task.config, slices, tagged[KEY_COLUMN], owners)
        return tagged.append_column(PRESENT_COLUMN, pa.array(present)), None
    present, values = live_rows_in_slices(task.storage, task.paths, task.config, slices, tagged[KEY_COLUMN], owners,
                                          columns)
    held = pa.array(present)
    found = pa.table({GROUP: pa.array(owners.astype(np.int32)), KEY_COLUMN: tagged[KEY_COLUMN], HELD: held,
                      **{c: values[c] for c in values.column_names}})
    return tagged.append_column(PRESENT_COLUMN, held), StoredRows(tuple(names), found)


def write_stream(task: WriteTask, chunks: Iterable[pa.Table], spill_dir: str | None) -> pa.Table:
    """Tagged chunks held by file group in memory up to `write.spill_bytes`, past it spilled (`hold`);
    then every file group is written. The keys of the file groups they name are read meanwhile
    (`key_prefetch`)."""
    with GroupSpill(spill_dir, task.config.options["write.spill_compression"]) as spill, \
            KeyPrefetch(task) as prefetch:
        held = hold(chunks, spill, task.config.options["write.spill_bytes"], seen=prefetch.see)
        mark_all(task.storage, task.paths, task.instant, {p for p, _ in spill.writers or held.keys})
        if not spill.writers:
            return write_groups(task, held.groups(), len(held.keys), prefetch=prefetch)
        return write_groups(task, spill.groups(), len(spill.writers), prefetch=prefetch)


def hold(chunks: Iterable[pa.Table], spill: GroupSpill, budget: int, background: bool = True,
         seen: Callable[[list[GroupRows]], None] | None = None) -> HeldGroups:
    """Tagged chunks held by file group; once they pass `budget` bytes, they and every later chunk go to
    `spill`, chunk by chunk: in a background thread while the next chunk is read and tagged (a spill's take
    and write release the GIL), or, without `background`, in turn. `seen` is told each chunk's file groups
    as soon as it is held. Returns what stayed held."""
    held = HeldGroups()
    with ThreadPoolExecutor(1, thread_name_prefix="metatable-spill") as spiller:
        spilling: Future | None = None
        for rows in chunks:
            if spilling is not None:
                spilling.result()  # one chunk spills while the next is tagged: memory holds two
            groups = held.add(rows)
            if seen is not None:
                seen(groups)
            if spill.writers or held.nbytes > budget:
                if background:
                    spilling = spiller.submit(spill_chunks, spill, held.take_chunks())
                else:
                    spill_chunks(spill, held.take_chunks())
        if spilling is not None:
            spilling.result()
    return held


def spill_tagged(task: WriteTask, chunks: Iterable[pa.Table], directory: str) -> list[dict]:
    """One share of a distributed write (`spark_write.run_spark`): its chunks tagged and appended by file
    group to Arrow files in `directory`, which stay for the write tasks (`write_spilled`). Returns a row per
    file group: its partition, file id, file and row count."""
    spill = GroupSpill(directory, task.config.options["write.spill_compression"])
    with bulk_memory():
        try:
            # one task per core keeps the cores busy: with a background spill (two chunks held) the SF 1 tag
            # stage took 3.27-3.39 s against 3.09-3.30 s in turn, and each worker peaked at 1.33 GB, not 1.21
            hold(tag_chunks(task, chunks), spill, 0, background=False)
        finally:
            spill.close()
    return spill.listing()


def write_spilled(task: WriteTask, groups: list[tuple[tuple[str, str], list[str]]]) -> pa.Table:
    """Write each (partition, file id) group from the spill files that the tagging tasks wrote for it, one
    group at a time: the write tasks, one per core, keep the cores busy (SF 1, 2 cores: 2.51-2.58 s
    against 2.63-2.76 s with a thread per core in each task, and a lower peak)."""
    with bulk_memory():
        return write_groups(task, (partial(read_spilled, paths, key) for key, paths in groups), len(groups), 1)


SPILL_TAKES = 8  # takes per spilled chunk (see spill_chunks)
GroupRows = tuple[tuple[str, str], np.ndarray]  # a file group (partition, file id) and its rows' indices
HeldChunk = tuple[pa.Table, list[GroupRows]]


class HeldGroups:
    """Tagged chunks kept in memory, with each file group's row indices in each: a stream that fits the
    budget is written from memory, without the spill's write and read-back (see docs/design-notes.md)."""

    def __init__(self) -> None:
        self.chunks: list[HeldChunk] = []
        self.keys: set[tuple[str, str]] = set()
        self.nbytes = 0

    def add(self, rows: pa.Table) -> list[GroupRows]:
        """Hold a tagged chunk; returns its file groups with their row indices."""
        partitions, files = rows[PARTITION_COLUMN], rows[FILE_ID_COLUMN]
        groups = [((partitions[int(g[0])].as_py(), files[int(g[0])].as_py()), g) for g in file_group_rows(rows)]
        self.chunks.append((rows, groups))
        self.keys.update(key for key, _ in groups)
        self.nbytes += rows.nbytes
        return groups

    def take_chunks(self) -> list[HeldChunk]:
        """The held chunks, no longer held."""
        chunks, self.chunks = self.chunks, []
        self.keys.clear()
        self.nbytes = 0
        return chunks

    def groups(self) -> Iterator[Callable[[], pa.Table]]:
        """A loader of each file group's rows (one table, taken when a writer thread calls it)."""
        parts: dict[tuple[str, str], list[tuple[pa.Table, np.ndarray]]] = {}
        for rows, groups in self.chunks:
            for key, group in groups:
                parts.setdefault(key, []).append((rows, group))
        for held in parts.values():
            yield partial(take_parts, held)


def spill_chunks(spill: GroupSpill, chunks: list[HeldChunk]) -> None:
    """Hand each chunk's file groups to `spill`, letting go of each chunk. One take puts about an eighth
    of the chunk in file-group order, and each group is a slice of it. A take per group cost twice as
    much (SF 1, 1M-row chunks of 56 groups: 0.40 s against 0.19 s per chunk); a take of the whole chunk
    held a copy of it: the SF 1 load's peak went from 1.5 to 2.1 GB."""
    while chunks:
        rows, groups = chunks.pop(0)
        rows = rows.drop_columns([PARTITION_COLUMN, FILE_ID_COLUMN])
        share = max(1, rows.num_rows // SPILL_TAKES)
        batch: list[tuple[tuple[str, str], np.ndarray]] = []
        batch_rows = 0
        for i, group in enumerate(groups):
            batch.append(group)
            batch_rows += len(group[1])
            if batch_rows >= share or i == len(groups) - 1:
                ordered = rows.take(np.concatenate([indices for _, indices in batch]))
                offset = 0
                for key, indices in batch:
                    spill.add(key, ordered.slice(offset, len(indices)))
                    offset += len(indices)
                batch, batch_rows = [], 0


def take_parts(parts: list[tuple[pa.Table, np.ndarray]]) -> pa.Table:
    taken = [rows.take(group) for rows, group in parts]
    return taken[0] if len(taken) == 1 else pa.concat_tables(taken).combine_chunks()


class GroupSpill:
    """Tagged rows appended chunk by chunk to one local Arrow IPC file per file group, then read back
    one file group at a time (memory-mapped). A file group's partition and file id are the same in all its
    rows, so they are kept once, not per row: taking and writing them was a quarter of a spill's take (SF 1,
    1M-row chunks: 0.19 -> 0.14 s). The directory is removed on exit, and by a rollback of the instant if the
    process dies."""

    def __init__(self, directory: str, compression: str) -> None:
        self.directory = directory
        self.options = pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression)
        self.writers: dict[tuple[str, str], tuple[str, pa.ipc.RecordBatchStreamWriter]] = {}
        self.rows: dict[tuple[str, str], int] = {}
        self.closed = False
        os.makedirs(directory, exist_ok=True)

    def __enter__(self) -> GroupSpill:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def close(self) -> None:
        if not self.closed:
            for _, writer in self.writers.values():
                writer.close()
            self.closed = True

    def add(self, key: tuple[str, str], group: pa.Table) -> None:
        """Append rows of the file group `key` (partition, file id), taken without those two columns."""
        if key not in self.writers:
            path = os.path.join(self.directory, f"{len(self.writers):06d}.arrow")
            self.writers[key] = (path, pa.ipc.new_stream(path, group.schema, options=self.options))
        self.writers[key][1].write_table(group)
        self.rows[key] = self.rows.get(key, 0) + group.num_rows

    def listing(self) -> list[dict]:
        """A row per file group: its partition, file id, spill file and row count."""
        return [{"partition": key[0], "file_id": key[1], "path": path, "rows": self.rows[key]}
                for key, (path, _) in self.writers.items()]

    def groups(self) -> Iterator[Callable[[], pa.Table]]:
        """A loader of each file group's rows (one table, read back when a writer thread calls it)."""
        self.close()
        for key, (path, _) in self.writers.items():
            yield partial(read_spilled, [path], key)


def read_spilled(paths: list[str], key: tuple[str, str]) -> pa.Table:
    """The rows of the file group `key` from its spill files, with its partition and file id put back."""
    parts = []
    for path in paths:
        with pa.memory_map(path) as source:
            parts.append(pa.ipc.open_stream(source).read_all())
    rows = pa.concat_tables(parts).combine_chunks()
    partition, file_id = key
    return rows.append_column(PARTITION_COLUMN, pa.repeat(pa.scalar(partition, pa.string()), rows.num_rows)) \
        .append_column(FILE_ID_COLUMN, pa.repeat(pa.scalar(file_id, pa.string()), rows.num_rows))
