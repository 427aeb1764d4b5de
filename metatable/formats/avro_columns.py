"""Avro binary encoding and decoding of whole columns: every row of a flat record schema (strings, longs,
booleans, and unions of null with a string) encoded or decoded at once with numpy and Arrow, byte for byte
what `fastavro`'s schemaless writer gives, and reads, for each row.

Why: a secondary index writes an entry per row whose values differ row by row (a reverse entry holds its
record's values), and fastavro encodes one record at a time: an index build of TPC-H SF 0.1 (600,572 rows,
1.2M entries) spent 2.8 of its 7.2 s encoding them one by one. A commit reads the reverse entries of every key
it writes: decoding 300,239 of them (a 5% upsert at SF 1) took fastavro 0.77-0.87 s, `decode_columns` 0.08-0.11 s.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_MAX_VARINT = 10  # bytes of a zig-zag varint of a 64-bit long
_ARROW = {"string": pa.string(), "long": pa.int64(), "boolean": pa.bool_()}


def varints(values: np.ndarray) -> pa.Array:
    """Each int64 as Avro's zig-zag varint."""
    n = values.astype(np.int64)
    rest = ((n << 1) ^ (n >> 63)).view(np.uint64)
    out = np.zeros((len(n), _MAX_VARINT), np.uint8)
    lengths = np.ones(len(n), np.int32)
    for i in range(_MAX_VARINT):
        low = (rest & np.uint64(0x7F)).astype(np.uint8)
        rest = rest >> np.uint64(7)
        more = rest != 0
        out[:, i] = low | (more.astype(np.uint8) << 7)
        if not more.any():
            break
        lengths += more
    data = out[np.arange(_MAX_VARINT) < lengths[:, None]]
    offsets = np.zeros(len(n) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(n), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _string(values: pa.Array) -> pa.Array:
    data = values.cast(pa.binary())
    lengths = pc.binary_length(data).to_numpy(zero_copy_only=False)
    return pc.binary_join_element_wise(varints(lengths), data, b"")


def _field(field_type: Any, values: pa.Array) -> pa.Array:
    if field_type == "string":
        return _string(values)
    if field_type == "long":
        return varints(values.to_numpy(zero_copy_only=False))
    if field_type == "boolean":
        return pc.if_else(values, pa.scalar(b"\x01"), pa.scalar(b"\x00"))
    if isinstance(field_type, list) and field_type[0] == "null" and field_type[1:] == ["string"]:
        present = pc.binary_join_element_wise(pa.scalar(b"\x02"), _string(pc.fill_null(values, "")), b"")
        return pc.if_else(pc.is_null(values), pa.scalar(b"\x00"), present)
    raise NotImplementedError(f"avro_columns encodes strings, longs, booleans and [null, string], not {field_type}")


def encode_columns(schema: Mapping[str, Any], columns: Mapping[str, Any], n: int) -> pa.Array:
    """The Avro encoding of `n` records of the parsed record `schema`; `columns` maps each field to an Arrow array
    of `n` values or a Python scalar shared by all."""
    parts = []
    for f in schema["fields"]:
        value = columns[f["name"]]
        if isinstance(value, pa.ChunkedArray):
            value = value.combine_chunks()
        elif not isinstance(value, pa.Array):
            value = pa.repeat(pa.scalar(value, _ARROW[f["type"] if isinstance(f["type"], str) else "string"]), n)
        parts.append(_field(f["type"], value))
    return pc.binary_join_element_wise(*parts, b"") if len(parts) > 1 else parts[0]


def decode_columns(schema: Mapping[str, Any], values: pa.Array | pa.ChunkedArray) -> pa.Table:
    """The records of the parsed record `schema` whose Avro encodings are `values`, as columns (the inverse of
    `encode_columns`). A value that is not one record of the schema raises `ValueError`."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], pa.binary())
    values = values.cast(pa.large_binary())
    n = len(values)
    _, offsets_buffer, data_buffer = values.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int64, n + 1, values.offset * 8) if n else np.zeros(1, np.int64)
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None and n else np.zeros(0, np.uint8)
    data = np.concatenate([data, np.zeros(_MAX_VARINT, np.uint8)])  # a varint is read as up to 10 bytes
    pos = offsets[:-1].copy()
    columns = {}
    for f in schema["fields"]:
        kind = f["type"]
        if kind == "long":
            columns[f["name"]], pos = _read_varints(data, pos)
        elif kind == "boolean":
            columns[f["name"]], pos = data[pos] != 0, pos + 1
        elif kind == "string":
            columns[f["name"]], pos = _read_strings(data, pos, None)
        elif isinstance(kind, list) and kind[0] == "null" and kind[1:] == ["string"]:
            branch, after = _read_varints(data, pos)
            columns[f["name"]], pos = _read_strings(data, after, branch == 1)
        else:
            raise NotImplementedError(f"avro_columns decodes strings, longs, booleans and [null, string], not {kind}")
    if not np.array_equal(pos, offsets[1:]):
        raise ValueError(f"{int(np.sum(pos != offsets[1:]))} of {n} values are not records of {schema['name']}")
    return pa.table({name: pa.array(c) if isinstance(c, np.ndarray) else c for name, c in columns.items()})


def _read_varints(data: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zig-zag varint at each position, and the position after it."""
    value = np.zeros(len(pos), np.uint64)
    length = np.zeros(len(pos), np.int64)
    going = np.ones(len(pos), bool)
    for i in range(_MAX_VARINT):
        byte = data[np.minimum(pos + i, len(data) - 1)]
        value |= np.where(going, (byte & 0x7F).astype(np.uint64) << np.uint64(7 * i), np.uint64(0))
        length += going
        going &= (byte & 0x80) != 0
        if not going.any():
            break
    decoded = (value >> np.uint64(1)).astype(np.int64) ^ -(value & np.uint64(1)).astype(np.int64)
    return decoded, pos + length


def _read_strings(data: np.ndarray, pos: np.ndarray, present: np.ndarray | None) -> tuple[pa.Array, np.ndarray]:
    """The length-prefixed string at each position (only where `present`; null elsewhere), and the position
    after it."""
    lengths, starts = _read_varints(data, pos)
    if present is not None:
        lengths, starts = np.where(present, lengths, 0), np.where(present, starts, pos)
    if np.any(lengths < 0) or np.any(starts + lengths > len(data) - _MAX_VARINT):
        raise ValueError("a string runs past the end of its value")
    ends = np.zeros(len(pos) + 1, np.int64)
    np.cumsum(lengths, out=ends[1:])
    gather = np.repeat(starts - ends[:-1], lengths) + np.arange(ends[-1])
    text = pa.Array.from_buffers(pa.large_string(), len(pos), [None, pa.py_buffer(ends), pa.py_buffer(data[gather])])
    if present is not None:
        text = pc.if_else(pa.array(present), text, pa.scalar(None, pa.large_string()))
    return text.cast(pa.string()), starts + lengths
