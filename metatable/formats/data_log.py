"""Data-table log blocks: the rows of one deltacommit for one file group.

The file is an Avro container (name and header conventions of `log_file`). Its
rows travel as one Arrow IPC file inside a single Avro record (the default), as
one Parquet file the same way, or as Avro records (one per row, schema derived
from the table's); `write.log.block_format` chooses, and docs/design-notes.md records the
measurement behind the default. A reader takes whichever a block holds.
"""
from __future__ import annotations

import io
import zlib
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from avro_schemas import schema

from metatable.errors import CorruptFileError
from metatable.formats.log_file import BlockKind, read_container, write_container
from metatable.schema_evolution import in_schema
from metatable.storage.base import Storage
from metatable.table_config import DELETED_COLUMN


# A block smaller than this is decoded on the calling thread: for the few-KB blocks of a small upsert, Arrow's
# thread pool cost more than it saved (0.57 -> 0.45 ms a block; `Table.get` reads them from its own threads).
THREADED_BLOCK_BYTES = 1 << 20
# An Arrow block smaller than this is written as an uncompressed IPC file compressed whole, in one codec call;
# a larger one has Arrow compress each buffer, so that a read of some columns (the keys a counted upsert
# reads, 2 of a lineitem log's 18) decompresses only theirs. A workload-benchmark file group's block of 67
# rows and 9 columns: 0.24 ms and 4,442 bytes buffer by buffer, 0.03 ms and 2,701 bytes whole (zstd).
WHOLE_BLOCK_BYTES = 64 << 10
CRC_KEY = "metatable.crc32"  # header entry: zlib's CRC-32 of an Arrow block's bytes as stored
CODEC_KEY = "metatable.codec"  # header entry of a block compressed whole: its codec
RAW_SIZE_KEY = "metatable.raw_size"  # and its IPC file's size


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
                   compression: str) -> int:
    """`rows` as a log block of `block_format`, compressed with `compression` (a codec of that format); returns
    the file's size."""
    if block_format == "arrow":
        sink = pa.BufferOutputStream()
        codec = None if compression == "none" else pa.Codec(compression)
        whole = codec is not None and rows.nbytes < WHOLE_BLOCK_BYTES
        with ipc.new_file(sink, rows.schema, options=ipc.IpcWriteOptions(compression=None if whole else codec)) \
                as writer:
            writer.write_table(rows)
        meta = _meta(instant, "arrow", rows.num_rows)
        if whole:
            ipc_file = sink.getvalue()
            arrow = codec.compress(ipc_file, asbytes=True)
            meta.update({CODEC_KEY: compression, RAW_SIZE_KEY: str(ipc_file.size)})
        else:
            arrow = sink.getvalue().to_pybytes()
        return write_container(storage, path, schema("arrow_block"), [{"arrow": arrow}], 1,
                               {**meta, CRC_KEY: str(zlib.crc32(arrow))})
    if block_format == "parquet":
        buf = io.BytesIO()
        pq.write_table(rows, buf, compression=compression, write_page_checksum=True)
        return write_parquet_log(storage, path, instant, buf.getvalue(), rows.num_rows)
    return write_container(storage, path, avro_row_schema(rows.schema), rows.to_pylist(), rows.num_rows,
                           _meta(instant, block_format, rows.num_rows))


def write_parquet_log(storage: Storage, path: str, instant: str, parquet: bytes, rows: int) -> int:
    """A log block carrying a Parquet file as it is (also a base file that must become a log: its rows,
    which have no deleted flag, are live); returns the file's size."""
    return write_container(storage, path, schema("parquet_block"), [{"parquet": parquet}], 1,
                           _meta(instant, "parquet", rows))


def _meta(instant: str, block_format: str, rows: int) -> dict[str, str]:
    return {"metatable.instant": instant, "metatable.block_kind": BlockKind.RECORDS.value,
            "metatable.format": block_format, "metatable.rows": str(rows)}


def read_data_log(storage: Storage, path: str, arrow_schema: pa.Schema) -> tuple[str, pa.Table]:
    """The block's instant and rows (in `arrow_schema`: an Arrow or Parquet block decodes only its columns)."""
    meta, records = read_container(storage, path)
    try:
        block_format = meta["metatable.format"]
        if block_format == "arrow":
            rows = _conform(_read_arrow(records[0]["arrow"], meta, arrow_schema.names, path), arrow_schema)
        elif block_format == "parquet":
            parquet = records[0]["parquet"]
            block = pq.ParquetFile(pa.BufferReader(parquet), page_checksum_verification=True)
            present = set(block.schema_arrow.names)
            rows = _conform(block.read(columns=[n for n in arrow_schema.names if n in present],
                                       use_threads=len(parquet) > THREADED_BLOCK_BYTES), arrow_schema)
        else:
            rows = pa.Table.from_pylist(records, schema=arrow_schema)
        expected = int(meta["metatable.rows"])
        instant = meta["metatable.instant"]
    except (KeyError, IndexError, ValueError, OSError, pa.ArrowException) as e:
        raise CorruptFileError(path, f"unreadable data block ({type(e).__name__}: {e})") from None
    if rows.num_rows != expected:
        raise CorruptFileError(path, f"truncated data block: {rows.num_rows} of {expected} rows")
    return instant, rows


def _read_arrow(arrow: bytes, meta: dict[str, str], names: list[str], path: str) -> pa.Table:
    """The columns `names` (those the block has) of an Arrow IPC block, after checking its CRC-32: Parquet
    blocks carry page checksums, IPC files none, and a flipped byte in an uncompressed buffer would read as
    another value. A block compressed whole (`WHOLE_BLOCK_BYTES`) is decompressed first."""
    if zlib.crc32(arrow) != int(meta[CRC_KEY]):
        raise CorruptFileError(path, "its data block fails its CRC-32 check (damaged bytes)")
    buffer = pa.py_buffer(arrow) if CODEC_KEY not in meta else \
        pa.Codec(meta[CODEC_KEY]).decompress(arrow, decompressed_size=int(meta[RAW_SIZE_KEY]))
    present = ipc.open_file(buffer).schema.names
    wanted = [present.index(n) for n in names if n in present]
    options = ipc.IpcReadOptions(included_fields=wanted, use_threads=len(arrow) > THREADED_BLOCK_BYTES)
    return ipc.open_file(buffer, options=options).read_all()


def _conform(table: pa.Table, arrow_schema: pa.Schema) -> pa.Table:
    """`table` in `arrow_schema`; a missing deleted flag means live rows. A block written in the table's
    own schema is returned as it is: conforming column by column cost 0.35 ms a block, a quarter of reading
    a small one."""
    if DELETED_COLUMN in arrow_schema.names and DELETED_COLUMN not in table.column_names:
        table = table.append_column(DELETED_COLUMN, pa.array(np.zeros(table.num_rows, dtype=bool)))
    return in_schema(table, arrow_schema)


def log_row_count(storage: Storage, path: str) -> int:
    meta, _ = read_container(storage, path)
    return int(meta.get("metatable.rows", 0))
