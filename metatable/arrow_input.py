"""Local data as Arrow: what the library's calls take besides a Spark DataFrame.

A pyarrow Table or RecordBatch as it is; a pandas DataFrame converted (`pa.Table.from_pandas`), its index
kept as columns only when every level of it is named (`df.set_index("id")` keeps `id`; a default or unnamed
index is no column of the table); anything else that exports the Arrow C stream interface
(`__arrow_c_stream__`: a Polars DataFrame, a DuckDB relation, a nanoarrow stream, ...) as a
RecordBatchReader, so that a large one is read in chunks. pandas is not imported here: a DataFrame of it
exists only once its caller imported it.
"""
from __future__ import annotations

import sys
from typing import Any

import pyarrow as pa

from metatable.errors import InvalidInputError

ACCEPTED = ("a pyarrow Table, RecordBatch or RecordBatchReader, a pandas or Polars DataFrame, or any object "
            "with __arrow_c_stream__ (a DuckDB relation, ...)")


def arrow_data(data: Any) -> pa.Table | pa.RecordBatchReader | None:
    """`data` as a pyarrow Table or a RecordBatchReader; None when it is neither local data nor a stream of
    it. A stream of something other than rows (a single array) is an error that says what it is."""
    if isinstance(data, (pa.Table, pa.RecordBatchReader)):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(data, pandas.DataFrame):
        return pa.Table.from_pandas(data, preserve_index=all(name is not None for name in data.index.names))
    if not hasattr(data, "__arrow_c_stream__"):
        return None
    try:
        return pa.RecordBatchReader.from_stream(data)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
        raise InvalidInputError(f"{type(data).__name__} exports an Arrow stream that pyarrow cannot read as rows: "
                                f"{e}; give {ACCEPTED}") from None


def arrow_table(data: Any, what: str) -> pa.Table:
    """`data` whole, as a pyarrow Table (a stream read to its end): for inputs whose rows decide together, a
    lookup's keys, a merge's source, a change feed's batch. `what` names the input in the error for anything
    else."""
    arrow = arrow_data(data)
    if arrow is None:
        raise InvalidInputError(f"{what} must be {ACCEPTED}; got {type(data).__name__}")
    return arrow.read_all() if isinstance(arrow, pa.RecordBatchReader) else arrow
