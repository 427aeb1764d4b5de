"""Data-table log blocks: the rows of one deltacommit for one file group.

The file is an Avro container (name and header conventions of `log_file`). Its
rows travel either as Avro records (one per row, schema derived from the
table's) or as one Parquet file inside a single Avro record; `write.log.block_format`
chooses, and docs/design-notes.md records the measurement behind the default.
"""
from __future__ import annotations

import io
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import CorruptFileError
from .log_file import BlockKind, read_container, write_container
from .schemas import schema
from .storage import Storage
from .table_config import DELETED_COLUMN


# A block smaller than this is decoded on the calling thread: for the few-KB blocks of a small upsert, Arrow's
# thread pool cost more than it saved (0.57 -> 0.45 ms a block; `Table.get` reads them from its own threads).
THREADED_BLOCK_BYTES = 1 << 20


def avro_row_schema(arrow_schema: pa.Schema) -> Any:
    """The Avro schema of a table's rows, every field nullable."""
    return fastavro.parse_schema({"type": "record", "name": "Row", "namespace": "metatable.data",
                                  "fields": [{"name": f.name, "type": ["null", _avro_type(f.type)], "default": None}
                                             for f in arrow_schema]})


def _avro_type(t: pa.DataType) -> Any:
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_integer(t):
        return "long" if t.bit_width == 64 or t in (pa.uint32(),) else "int"
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_floating(t):
        return "double"
    if pa.types.is_string(t):
        return "string"
    if pa.types.is_binary(t):
        return "bytes"
    if pa.types.is_date32(t):
        return {"type": "int", "logicalType": "date"}
    if pa.types.is_timestamp(t):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if pa.types.is_decimal(t):
        return {"type": "bytes", "logicalType": "decimal", "precision": t.precision, "scale": t.scale}
    raise TypeError(f"no Avro type for {t}")


def write_data_log(storage: Storage, path: str, instant: str, rows: pa.Table, block_format: str,
                   compression: str) -> None:
    if block_format == "parquet":
        buf = io.BytesIO()
        pq.write_table(rows, buf, compression=compression, write_page_checksum=True)
        write_parquet_log(storage, path, instant, buf.getvalue(), rows.num_rows)
    else:
        write_container(storage, path, avro_row_schema(rows.schema), rows.to_pylist(), rows.num_rows,
                        _meta(instant, block_format, rows.num_rows))


def write_parquet_log(storage: Storage, path: str, instant: str, parquet: bytes, rows: int) -> None:
    """A log block carrying a Parquet file as it is (also a base file that must become a log: its rows,
    which have no deleted flag, are live)."""
    write_container(storage, path, schema("parquet_block"), [{"parquet": parquet}], 1, _meta(instant, "parquet", rows))


def _meta(instant: str, block_format: str, rows: int) -> dict[str, str]:
    return {"metatable.instant": instant, "metatable.block_kind": BlockKind.RECORDS.value,
            "metatable.format": block_format, "metatable.rows": str(rows)}


def read_data_log(storage: Storage, path: str, arrow_schema: pa.Schema) -> tuple[str, pa.Table]:
    """The block's instant and rows (in `arrow_schema`: a Parquet block reads only its columns)."""
    meta, records = read_container(storage, path)
    try:
        if meta["metatable.format"] == "parquet":
            parquet = records[0]["parquet"]
            block = pq.ParquetFile(pa.BufferReader(parquet), page_checksum_verification=True)
            present = set(block.schema_arrow.names)
            rows = _conform(block.read(columns=[n for n in arrow_schema.names if n in present],
                                       use_threads=len(parquet) > THREADED_BLOCK_BYTES), arrow_schema)
        else:
            rows = pa.Table.from_pylist(records, schema=arrow_schema)
        expected = int(meta["metatable.rows"])
    except (KeyError, IndexError, OSError, pa.ArrowException) as e:
        raise CorruptFileError(path, f"unreadable data block ({type(e).__name__}: {e})") from None
    if rows.num_rows != expected:
        raise CorruptFileError(path, f"truncated data block: {rows.num_rows} of {expected} rows")
    return meta["metatable.instant"], rows


def _conform(table: pa.Table, arrow_schema: pa.Schema) -> pa.Table:
    """`table` in `arrow_schema`; a missing deleted flag means live rows. A block written in the table's
    own schema is returned as it is: conforming column by column cost 0.35 ms a block, a quarter of reading
    a small one."""
    if table.schema.equals(arrow_schema):
        return table
    columns = [table[f.name] if f.name in table.column_names
               else pa.array(np.zeros(table.num_rows, dtype=bool)) if f.name == DELETED_COLUMN
               else pa.nulls(table.num_rows, f.type) for f in arrow_schema]
    return pa.Table.from_arrays(columns, names=arrow_schema.names).cast(arrow_schema)


def log_row_count(storage: Storage, path: str) -> int:
    meta, _ = read_container(storage, path)
    return int(meta.get("metatable.rows", 0))
