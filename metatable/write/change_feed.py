"""A change feed's batch as one write of upserts and deletes: the feed's operation column becomes the flag
each row of a mixed write carries (`DELETED_COLUMN`), on Spark or in Arrow.

With `sequence_by`, the feed says in which order its rows happened (metatable's own feed:
`_commit_instant`, `_commit_seq`), and that order decides, not the ordering field: each record's last row
is applied, and where a delete came before it in the batch, the row is flagged to reset its record
(`RESET_COLUMN`): it replaces the stored row whatever its ordering value, as the record deleted and
inserted again in the source did. Without it, a record the source deleted and inserted again with a smaller
ordering value would keep the target's older row."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metatable.arrow_input import arrow_table
from metatable.errors import InvalidInputError
from metatable.spark.session import is_dataframe
from metatable.table_config import DELETED_COLUMN, RESET_COLUMN

DELETE_VALUES = ("d", "D", "delete")  # what marks a delete by default (Debezium's "d")


def flagged(data: Any, operation_column: str, delete_values: Sequence[Any], sequence_by: Sequence[str] = (),
            identity: Sequence[str] = ()) -> Any:
    """The batch without its operation column, with a flag per row: whether the row deletes its key. With
    `sequence_by`, one row per record (`identity`: the columns that name one), as the module says."""
    if is_dataframe(data):
        names = data.columns
    else:  # a batch: held whole, as its rows decide together
        data = arrow_table(data, "a change feed's batch (or a Spark DataFrame)")
        names = data.column_names
    if operation_column not in names:
        raise InvalidInputError(f"the change feed has no operation column {operation_column!r} (columns: {names}); "
                                "name it with operation_column=")
    if missing := [c for c in sequence_by if c not in names]:
        raise InvalidInputError(f"the change feed has no sequence columns {missing} (columns: {names})")
    if is_dataframe(data):
        return _flagged_dataframe(data, operation_column, delete_values, list(sequence_by), list(identity))
    ops = data[operation_column]
    deletes = pc.fill_null(pc.is_in(ops, value_set=pa.array(list(delete_values), ops.type)), False)
    table = data.drop_columns([operation_column]).append_column(DELETED_COLUMN, deletes)
    return _last_of_each_record(table, list(sequence_by), list(identity)) if sequence_by else table


def _last_of_each_record(table: pa.Table, sequence_by: list[str], identity: list[str]) -> pa.Table:
    """Each record's last row by `sequence_by`, flagged to reset it where one of its earlier rows deletes."""
    order = pc.sort_indices(table, [(c, "descending") for c in sequence_by])
    ranked = table.select(identity).take(order).append_column("_mt_at", pa.array(np.arange(table.num_rows)))
    ranked = ranked.append_column(DELETED_COLUMN, table[DELETED_COLUMN].take(order))
    groups = ranked.group_by(identity, use_threads=False).aggregate([("_mt_at", "min"), (DELETED_COLUMN, "any")])
    last = order.take(groups["_mt_at_min"])
    rows = table.take(last).drop_columns(sequence_by)
    resets = pc.and_(pc.invert(rows[DELETED_COLUMN]), groups[f"{DELETED_COLUMN}_any"])
    return rows.append_column(RESET_COLUMN, resets)


def _flagged_dataframe(df: Any, operation_column: str, delete_values: Sequence[Any], sequence_by: list[str],
                       identity: list[str]) -> Any:
    from pyspark.sql import Window, functions as F  # only for a Spark input: pyspark is not needed otherwise

    df = df.withColumn(DELETED_COLUMN, F.coalesce(F.col(operation_column).isin(list(delete_values)),
                                                  F.lit(False))).drop(operation_column)
    if not sequence_by:
        return df
    record = Window.partitionBy(*identity)
    newest_first = record.orderBy(*[F.col(c).desc() for c in sequence_by])
    return (df.withColumn("_mt_rank", F.row_number().over(newest_first))
            .withColumn("_mt_any_delete", F.max(F.col(DELETED_COLUMN)).over(record))
            .where("_mt_rank = 1")
            .withColumn(RESET_COLUMN, ~F.col(DELETED_COLUMN) & F.col("_mt_any_delete"))
            .drop("_mt_rank", "_mt_any_delete", *sequence_by))
