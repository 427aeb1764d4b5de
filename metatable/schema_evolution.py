"""How a table's schema may change: columns are added (nullable) and widened; never dropped, narrowed or
retyped.

A file keeps the schema it was written with. A reader reads every file into the schema of its snapshot:
a column the file lacks reads as nulls, a narrower one is cast up (`file_group.slice_reader.read_base`).
That is why only changes that every old value survives are allowed: Iceberg's set (int to long, float to
double, decimal precision up), plus the smaller integers. Columns are matched by name; a rename would need
field ids in every file, which Parquet files written by pyarrow do not carry: renames are refused, as
drops are (Delta Lake refuses both without its column-mapping table feature, for the same reason).
"""
from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from metatable.errors import InvalidInputError
from metatable.table_config import normalize_schema

_SIGNED = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_UNSIGNED = (pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64())


def in_schema(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """Rows read or written in an older or looser schema, in `schema`: as they are where their schema is it
    already; else a column they lack reads as nulls, one of another type is cast (a widening), and the others
    are taken as they are (a cast costs even when nothing changes: 127 us against 26 us for the 9 columns of
    a workload-benchmark file group's 67 rows), under `schema`'s fields (its nullability too)."""
    if rows.schema.equals(schema):
        return rows
    present = rows.schema
    columns = []
    for f in schema:
        i = present.get_field_index(f.name)
        columns.append(pa.nulls(rows.num_rows, f.type) if i < 0 else
                       rows.column(i) if present.field(i).type == f.type else rows.column(i).cast(f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def widens(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether every value of `source` is a value of `target`, exactly, and `target` is another type."""
    if source == target:
        return False
    for family in (_SIGNED, _UNSIGNED):
        if source in family and target in family:
            return family.index(target) > family.index(source)
    if source in _UNSIGNED[:3] and target in _SIGNED:
        return _SIGNED.index(target) > _UNSIGNED.index(source)
    if pa.types.is_floating(source) and pa.types.is_floating(target):
        return target.bit_width > source.bit_width
    if pa.types.is_decimal(source) and pa.types.is_decimal(target):
        return (target.scale == source.scale and target.precision > source.precision
                and target.byte_width == source.byte_width)
    return False


def evolve(current: pa.Schema, wanted: Sequence[pa.Field] | pa.Schema, fixed: Sequence[str], *,
           what: str) -> pa.Schema:
    """`current` with the columns of `wanted` it lacks appended (nullable) and those `wanted` widens widened;
    columns `wanted` does not name stay as they are, and so does a column whose type in `wanted` is not a
    widening of its own (`check_changes` refuses that first; a write casts to the table's type). Widening a
    `fixed` column is refused (the record key and partition columns: the key strings and partition paths
    of the rows already written depend on their types). `what` names the change in errors.
    """
    wanted = normalize_schema(pa.schema(list(wanted)))
    fields = {f.name: f for f in current}
    for field in wanted:
        have = fields.get(field.name)
        if have is None:
            fields[field.name] = field
        elif have.type != field.type and widens(have.type, field.type):
            if field.name in fixed:
                raise InvalidInputError(f"{what}: column {field.name!r} is a record key or partition column; its "
                                        f"type ({have.type}) cannot change. Nothing was written")
            fields[field.name] = have.with_type(field.type)
    return pa.schema(list(fields.values()))


def check_changes(current: pa.Schema, fields: Sequence[pa.Field], fixed: Sequence[str]) -> pa.Schema:
    """`Table.add_columns`: the evolved schema, or an error for a field that is neither new nor a widening of
    its column (narrowing, another type, a non-nullable new column)."""
    if not fields or not all(isinstance(f, pa.Field) for f in fields):
        raise InvalidInputError("add_columns takes a non-empty list of pyarrow fields, e.g. [pa.field('c', "
                                "pa.string())]")
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise InvalidInputError(f"add_columns names a column twice: {names}")
    for field in fields:
        have = current.field(field.name) if field.name in current.names else None
        if have is None and not field.nullable:
            raise InvalidInputError(f"add_columns: column {field.name!r} is not nullable, but the rows already "
                                    "written have no value for it; add it nullable. Nothing was written")
        new_type = normalize_schema(pa.schema([field])).field(0).type
        if have is not None and have.type != new_type and not widens(have.type, new_type):
            raise InvalidInputError(
                f"add_columns: column {field.name!r} is {have.type}; {new_type} is not a widening of it (allowed: "
                "a wider integer, float to double, a decimal's precision up at the same scale). Dropping, "
                "narrowing or retyping a column is not supported. Nothing was written")
    return evolve(current, fields, fixed, what="add_columns")


def merged_write_schema(current: pa.Schema, data: pa.Schema, fixed: Sequence[str]) -> pa.Schema:
    """`schema_mode="merge"`: the data's new columns are added. Its types for columns the table has are cast
    on write, as without merge (`write_input.conform`): a merge never widens, since data from Python lists
    is int64 and double whatever the table holds; widening is `add_columns`' (Delta Lake's mergeSchema
    does not widen either, without its type-widening feature)."""
    return evolve(current, [f for f in data if f.name not in current.names], fixed, what="schema_mode='merge'")
