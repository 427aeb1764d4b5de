"""A change feed's batch as one write of upserts and deletes: the feed's operation column becomes the flag
each row of a mixed write carries (`DELETED_COLUMN`), on Spark or in Arrow."""
from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from metatable.errors import InvalidInputError
from metatable.spark.session import is_dataframe
from metatable.table_config import DELETED_COLUMN

DELETE_VALUES = ("d", "D", "delete")  # what marks a delete by default (Debezium's "d")


def flagged(data: Any, operation_column: str, delete_values: Sequence[Any]) -> Any:
    """The batch without its operation column, with a flag per row: whether the row deletes its key."""
    if is_dataframe(data):
        from pyspark.sql import functions as F  # only for a Spark input: pyspark is not needed otherwise

        names = data.columns
    elif isinstance(data, (pa.Table, pa.RecordBatch)):
        names = data.column_names
    else:
        raise InvalidInputError(f"a change feed's batch is a pyarrow Table or a Spark DataFrame, got "
                                f"{type(data).__name__}")
    if operation_column not in names:
        raise InvalidInputError(f"the change feed has no operation column {operation_column!r} (columns: {names}); "
                                "name it with operation_column=")
    if is_dataframe(data):
        return data.withColumn(DELETED_COLUMN, F.coalesce(F.col(operation_column).isin(list(delete_values)),
                                                          F.lit(False))).drop(operation_column)
    ops = data[operation_column]
    deletes = pc.fill_null(pc.is_in(ops, value_set=pa.array(list(delete_values), ops.type)), False)
    table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
    return table.drop_columns([operation_column]).append_column(DELETED_COLUMN, deletes)
