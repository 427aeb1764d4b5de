"""Running a write task's Arrow functions: tag every row, then write each file group as its rows stream by.

The same functions run in-process for a pyarrow input (`run_local`) and inside Spark's Arrow stages
(`spark_engine`), so a write needs Spark only for scale and commits the same files either way.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from indexes.assigner import Assignment

from .file_group_writer import write_file_group
from .table_config import KEY_COLUMN
from .tagging import Tagger, tag_inputs
from .write_task import FILE_ID_COLUMN, MOVED_OUT_COLUMN, PARTITION_COLUMN, WriteTask
from .written import STATS_SCHEMA


def with_tags(rows: pa.Table, keys: pa.Array, assignment: Assignment) -> pa.Table:
    """`rows` with their key, partition path and file group; rows assigned nowhere are dropped. A row whose
    key moved partition also goes, flagged `MOVED_OUT_COLUMN`, to the file group it moved out of."""
    tagged = rows.append_column(KEY_COLUMN, keys).append_column(PARTITION_COLUMN, assignment.partitions) \
        .append_column(FILE_ID_COLUMN, assignment.file_ids)
    if assignment.moved_from is not None:
        old_partitions, old_files = assignment.moved_from
        moved = pc.is_valid(old_files)
        out = tagged.filter(moved).set_column(tagged.schema.get_field_index(PARTITION_COLUMN), PARTITION_COLUMN,
                                              old_partitions.filter(moved)) \
            .set_column(tagged.schema.get_field_index(FILE_ID_COLUMN), FILE_ID_COLUMN, old_files.filter(moved))
        tagged = pa.concat_tables([tagged.append_column(MOVED_OUT_COLUMN, pa.repeat(False, tagged.num_rows)),
                                   out.append_column(MOVED_OUT_COLUMN, pa.repeat(True, out.num_rows))])
    return tagged.filter(pc.is_valid(tagged[FILE_ID_COLUMN])) if tagged[FILE_ID_COLUMN].null_count else tagged


def split_by_file_group(tagged: pa.Table, presorted: bool = False) -> Iterator[pa.Table]:
    """The rows of each file group, one table at a time (runs of equal file groups if `presorted`)."""
    if tagged.num_rows == 0:
        return
    if not presorted:
        order = pc.sort_indices(tagged, sort_keys=[(PARTITION_COLUMN, "ascending"), (FILE_ID_COLUMN, "ascending")])
        tagged = tagged.take(order)
    group = pc.binary_join_element_wise(tagged[PARTITION_COLUMN], tagged[FILE_ID_COLUMN], "\x00").combine_chunks()
    starts = np.flatnonzero(np.r_[True, pc.not_equal(group.slice(1), group.slice(0, len(group) - 1))
                                  .to_numpy(zero_copy_only=False)])
    bounds = list(starts) + [len(group)]
    for start, end in zip(bounds[:-1], bounds[1:]):
        yield tagged.slice(start, end - start)


def write_sorted_batches(task: WriteTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Write a stream of tagged batches sorted by file group, holding one file group's rows at a time."""
    pending: list[pa.Table] = []
    current = None
    for batch in batches:
        for run in split_by_file_group(pa.Table.from_batches([batch]), presorted=True):
            key = (run[PARTITION_COLUMN][0].as_py(), run[FILE_ID_COLUMN][0].as_py())
            if key != current and pending:
                yield from write_file_group(task, pa.concat_tables(pending)).to_batches()
                pending = []
            current = key
            pending.append(run)
    if pending:
        yield from write_file_group(task, pa.concat_tables(pending)).to_batches()


def run_local(task: WriteTask, data: pa.Table) -> pa.Table:
    """The whole write in this process; `data` is conformed to the table. Returns the files' statistics."""
    keys, assignment = Tagger(task)(data.select(tag_inputs(task.config)))
    tagged = with_tags(data, keys, assignment)
    results = [write_file_group(task, group) for group in split_by_file_group(tagged)]
    return pa.concat_tables(results) if results else STATS_SCHEMA.empty_table()
