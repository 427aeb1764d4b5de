"""A write's input checked against the table before anything is written: columns and types, conformed once."""
from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .errors import InvalidInputError
from .table_config import TableConfig


def as_arrow(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    raise InvalidInputError(f"write data must be a Spark DataFrame or a pyarrow Table, got {type(data).__name__}")


def needed_columns(config: TableConfig, operation: str) -> list[str]:
    """The table's columns, in its order; deletes need only the key and partition columns."""
    if operation == "delete":
        return list(dict.fromkeys([*config.record_key, *config.partition_by]))
    return list(config.schema.names)


def conformed_schema(source: pa.Schema, config: TableConfig, operation: str) -> pa.Schema:
    """The schema the input is cast to; raises for missing or extra columns and types that do not convert."""
    schema = config.schema
    needed = needed_columns(config, operation)
    missing = [c for c in needed if c not in source.names]
    if missing:
        raise InvalidInputError(f"the data lacks columns {missing} that the table needs for {operation}")
    if operation != "delete":
        extra = [c for c in source.names if c not in schema.names]
        if extra:
            raise InvalidInputError(f"the data has columns {extra} that the table does not "
                                    f"(table columns: {schema.names}); select the table's columns or "
                                    "recreate the table with the new schema")
    for name in needed:
        target, have = schema.field(name).type, source.field(name).type
        if not castable(have, target):
            raise InvalidInputError(f"column {name!r} has type {have}, the table stores {target}; "
                                    "cast it before writing")
    return pa.schema([schema.field(name) for name in needed])


def conform(batch: pa.Table, config: TableConfig, operation: str) -> pa.Table:
    """The batch in the table's column order and types (values that do not convert are an error)."""
    target = conformed_schema(batch.schema, config, operation)
    columns = []
    for field in target:
        try:
            columns.append(pc.cast(batch[field.name], field.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidInputError(f"column {field.name!r} has type {batch.schema.field(field.name).type}, which "
                                    f"does not convert to the table's {field.type}: {e}") from None
    return pa.table(columns, names=target.names)


def castable(source: pa.DataType, target: pa.DataType) -> bool:
    """Only conversions that cannot change a value's meaning (same family, same or wider range)."""
    if source == target or pa.types.is_null(source):
        return True
    families = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_timestamp,
                pa.types.is_date, pa.types.is_boolean)
    for family in families:
        if family(source) and family(target):
            return True
    if pa.types.is_integer(source) and (pa.types.is_floating(target) or pa.types.is_decimal(target)):
        return True
    strings = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
    binaries = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)
    return (any(f(source) for f in strings) and any(f(target) for f in strings)) or \
        (any(f(source) for f in binaries) and any(f(target) for f in binaries))
