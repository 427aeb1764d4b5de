"""A reader for Thrift's compact protocol, enough to decode Parquet's footer, page index and page headers.

pyarrow parses Parquet footers but does not expose the page index (where each page of a column
starts, and its min/max), which point lookups need. A struct decodes to a dict from field id to value;
lists and sets to lists; maps to dicts; binaries stay bytes.

Plain functions over (buffer, position): this shape measured 2.5x faster than a reader object (3 vs
7 us for a page header), and `leading_ints` reads a page header's type and sizes without the rest,
`leading_list_size` an offset index's page count without the pages.
"""
from __future__ import annotations

import struct
from typing import Any, Sequence

import numpy as np

from metatable.errors import CorruptFileError

_DOUBLE = struct.Struct("<d")
_BOOL_TRUE, _BOOL_FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE_T, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


def read_struct(buffer: bytes, position: int, what: str) -> tuple[dict[int, Any], int]:
    """The struct at `position` of `buffer` (read from the file `what`) and the position just after it."""
    try:
        return _struct(buffer, position, what)
    except (IndexError, struct.error):
        raise CorruptFileError(what, "thrift data ends inside a value") from None


def leading_ints(buffer: bytes, count: int) -> list[int] | None:
    """Fields 1..count of the struct at the start of `buffer` when they come first and are integers (as
    a Parquet page header's type and sizes do), without decoding the rest; else None."""
    values = []
    position = 0
    try:
        for _ in range(count):
            header = buffer[position]
            if header >> 4 != 1 or not _I16 <= header & 0x0F <= _I64:
                return None
            n = shift = 0
            while True:  # _varint, inline: this runs once per key looked up
                position += 1
                byte = buffer[position]
                n |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
            position += 1
            values.append((n >> 1) ^ -(n & 1))
    except IndexError:
        return None
    return values


def leading_list_size(buffer: bytes) -> int | None:
    """The length of the list that is field 1 of the struct at the start of `buffer` (an offset index's page
    locations), without decoding its items; None when the struct does not start that way."""
    try:
        return _list_header(buffer, 1)[0] if buffer[0] == 0x10 | _LIST else None
    except IndexError:
        return None


def page_locations(buffer: bytes, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An offset index's page locations (field 1 of the struct at the start of `buffer`) as three int64
    arrays: each page's byte offset, stored size and first row (`page_locations_many` of one)."""
    return page_locations_many([buffer], what)[0]


def page_locations_many(buffers: Sequence[bytes], what: str) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """`page_locations` of several offset indexes (a file's columns). Writers encode every location alike, so
    they decode all at once with numpy (`_uniform_locations`); should any not be so encoded, each goes on its
    own, through `read_struct` where it is not."""
    if not buffers:
        return []
    uniform = _uniform_locations(buffers)
    if uniform is not None:
        return uniform
    if len(buffers) > 1:
        return [page_locations(buffer, what) for buffer in buffers]
    locations = read_struct(buffers[0], 0, what)[0].get(1, [])
    return [tuple(np.array([location[k] for location in locations], dtype=np.int64)  # type: ignore[misc]
                  for k in (1, 2, 3))]


# A PageLocation as writers encode it: a header byte for field 1 (i64), a varint, field 2 (i32), a varint,
# field 3 (i64), a varint, the stop byte. Seven tokens, each ending at the first byte below 0x80.
_LOCATION_TOKENS = 7
_LOCATION_HEADERS = np.array([0x10 | _I64, 0x10 | _I32, 0x10 | _I64, 0], dtype=np.uint8)


def _list_start(buffer: bytes) -> tuple[int, int] | None:
    """(locations, position of the first) of an offset index whose field 1 is a non-empty list of structs."""
    try:
        if buffer[0] != 0x10 | _LIST:
            return None
        size, element, position = _list_header(buffer, 1)
    except IndexError:
        return None
    return (size, position) if element == _STRUCT and size else None


def _uniform_locations(buffers: Sequence[bytes]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """`page_locations_many` when every location of every buffer is the seven tokens above and each struct
    ends well after them, else None: one pass of numpy over all the buffers. Measured on the 56 base files of
    an SF 1 table (18 columns, 2,048-row pages): 148 -> 41 ms for all 1,008 offset indexes one by one; a
    file's at once, 1.06 -> 1.00 ms for one of those files, and 261 -> 66 us for one of the workload
    benchmark's (8 columns of 2 pages), where the calls, not the bytes, took the time."""
    heads = [_list_start(buffer) for buffer in buffers]
    if any(head is None for head in heads):
        return None
    data = np.frombuffer(b"".join(buffers), dtype=np.uint8)
    bases = np.cumsum([0] + [len(buffer) for buffer in buffers])
    every_end = np.flatnonzero(data < 0x80)
    ends, firsts = [], []
    for buffer, base, (size, position) in zip(buffers, bases.tolist(), heads):  # type: ignore[misc]
        at = int(np.searchsorted(every_end, base + position))
        mine = every_end[at:at + _LOCATION_TOKENS * size]
        if len(mine) < _LOCATION_TOKENS * size or int(mine[-1]) >= base + len(buffer) or \
                not _ends_well(buffer, int(mine[-1]) - base + 1):
            return None
        ends.append(mine)
        firsts.append(base + position)
    sizes = [size for size, _ in heads]  # type: ignore[misc]
    ends_all = np.concatenate(ends)
    starts = np.concatenate([[0], ends_all[:-1] + 1])
    starts[np.cumsum([0] + [_LOCATION_TOKENS * size for size in sizes[:-1]])] = firsts  # each list's first
    starts = starts.reshape(-1, _LOCATION_TOKENS)
    widths = ends_all.reshape(-1, _LOCATION_TOKENS) - starts + 1
    if (widths[:, 0::2] != 1).any() or (data[starts[:, 0::2]] != _LOCATION_HEADERS).any() \
            or (widths[:, 1::2] > 10).any():
        return None
    # the varints' j-th bytes, for each j up to the widest: a pass over the values, not over every byte (an SF 1
    # file's 18 offset indexes, 1,656 locations in 43 KB: 440 -> 123 us; a per-byte shift summed per token)
    value_starts, value_widths = starts[:, 1::2].ravel(), widths[:, 1::2].ravel()
    n = np.zeros(len(value_starts), np.uint64)
    for j in range(int(value_widths.max(initial=0))):
        seven = data[np.minimum(value_starts + j, len(data) - 1)] & np.uint8(0x7F)
        seven[value_widths <= j] = 0
        n |= seven.astype(np.uint64) << np.uint64(7 * j)
    n = n.reshape(-1, 3)
    values = (n >> np.uint64(1)).astype(np.int64) ^ -(n & np.uint64(1)).astype(np.int64)
    splits = np.cumsum(sizes)[:-1]
    return [(part[:, 0].copy(), part[:, 1].copy(), part[:, 2].copy()) for part in np.split(values, splits)]


def _ends_well(buffer: bytes, position: int) -> bool:
    """Whether an offset index ends at `position` (the stop byte) or after the list of i64 that may follow
    its locations (field 2, each BYTE_ARRAY page's unencoded size), as writers encode them; the generic
    decoder checks any other ending."""
    rest = buffer[position:]
    if rest == b"\x00":
        return True
    try:
        if rest[0] != 0x10 | _LIST:  # field 2 (the delta from field 1)
            return False
        size, element, start = _list_header(rest, 1)
    except IndexError:
        return False
    ends = np.flatnonzero(np.frombuffer(rest, dtype=np.uint8, offset=start) < 0x80)
    return element == _I64 and len(ends) == size + 1 and start + int(ends[-1]) == len(rest) - 1 and rest[-1] == 0


def _varint(buffer: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buffer[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7


def _field_header(buffer: bytes, position: int, field_id: int) -> tuple[int, int, int]:
    """(kind, field id, position after) of the field header at `position`; kind 0 ends the struct."""
    header = buffer[position]
    if header >> 4 or not header:  # a field id delta, or the stop byte
        return header & 0x0F, field_id + (header >> 4), position + 1
    n, position = _varint(buffer, position + 1)
    return header & 0x0F, (n >> 1) ^ -(n & 1), position


def _list_header(buffer: bytes, position: int) -> tuple[int, int, int]:
    """(size, element kind, position after) of a list or set header."""
    header = buffer[position]
    size, element = header >> 4, header & 0x0F
    if size == 15:
        size, position = _varint(buffer, position + 1)
        return size, element, position
    return size, element, position + 1


def _struct(buffer: bytes, position: int, what: str) -> tuple[dict[int, Any], int]:
    fields: dict[int, Any] = {}
    field_id = 0
    while True:  # `_field_header` inlined: a call per field measured 8% slower on page indexes
        header = buffer[position]
        position += 1
        kind = header & 0x0F
        if kind == 0:
            return fields, position
        if header >> 4:
            field_id += header >> 4
        else:
            n, position = _varint(buffer, position)
            field_id = (n >> 1) ^ -(n & 1)
        if kind <= _BOOL_FALSE:
            fields[field_id] = kind == _BOOL_TRUE
        elif _I16 <= kind <= _I64:
            n = buffer[position]  # most integers of a footer fit one byte: no call for those
            if n < 0x80:
                position += 1
            else:
                n, position = _varint(buffer, position)
            fields[field_id] = (n >> 1) ^ -(n & 1)
        else:
            fields[field_id], position = _value(buffer, position, kind, what)


def _value(buffer: bytes, position: int, kind: int, what: str) -> tuple[Any, int]:
    if _I16 <= kind <= _I64:
        n, position = _varint(buffer, position)
        return (n >> 1) ^ -(n & 1), position
    if kind == _BINARY:
        n, position = _varint(buffer, position)
        return _take(buffer, position, n)
    if kind == _STRUCT:
        return _struct(buffer, position, what)
    if kind in (_LIST, _SET):
        size, element, position = _list_header(buffer, position)
        if element in (_BOOL_TRUE, _BOOL_FALSE):  # booleans in containers take one byte each
            flags, position = _take(buffer, position, size)
            return [b == _BOOL_TRUE for b in flags], position
        items = []
        if element == _BINARY or _I16 <= element <= _I64:
            # a page index's min/max values and null counts, thousands: decoded inline, a one-byte varint
            # without a call (the key column index of an SF 1 base file: 345-360 -> 200-215 us)
            binary = element == _BINARY
            for _ in range(size):
                n = buffer[position]
                if n < 0x80:
                    position += 1
                else:
                    n, position = _varint(buffer, position)
                if binary:
                    items.append(buffer[position:position + n])
                    position += n
                else:
                    items.append((n >> 1) ^ -(n & 1))
            if position > len(buffer):
                raise IndexError(position)
        elif element == _STRUCT:
            for _ in range(size):
                item, position = _struct(buffer, position, what)
                items.append(item)
        else:
            for _ in range(size):
                item, position = _value(buffer, position, element, what)
                items.append(item)
        return items, position
    if kind == _MAP:
        size, position = _varint(buffer, position)
        if not size:
            return {}, position
        types = buffer[position]
        position += 1
        entries = {}
        for _ in range(size):
            key, position = _value(buffer, position, types >> 4, what)
            entries[key], position = _value(buffer, position, types & 0x0F, what)
        return entries, position
    if kind == _BYTE:
        raw, position = _take(buffer, position, 1)
        return int.from_bytes(raw, "little", signed=True), position
    if kind == _DOUBLE_T:
        return _DOUBLE.unpack_from(buffer, position)[0], position + 8
    raise CorruptFileError(what, f"unknown thrift type {kind} at byte {position}")


def _take(buffer: bytes, position: int, n: int) -> tuple[bytes, int]:
    end = position + n
    if end > len(buffer):
        raise IndexError(end)
    return buffer[position:end], end


def field_span(buffer: bytes, field: int, what: str) -> tuple[int, int] | None:
    """Where the value of field `field` of the struct at the start of `buffer` starts and ends, None where the
    struct lacks it: a writer can replace it (a schema element's name)."""
    field_id, position = 0, 0
    try:
        while True:
            kind, field_id, start = _field_header(buffer, position, field_id)
            if kind == 0:
                return None
            position = start if kind <= _BOOL_FALSE else _value(buffer, start, kind, what)[1]
            if field_id == field:
                return start, position
    except (IndexError, struct.error):
        raise CorruptFileError(what, "thrift data ends inside a value") from None


def struct_spans(buffer: bytes, position: int, field: int, what: str) -> list[tuple[int, int]]:
    """Where each struct of the list in field `field` of the struct at `position` starts and ends, so that
    a writer can copy them verbatim (a Parquet footer's schema elements)."""
    field_id = 0
    try:
        while True:
            kind, field_id, position = _field_header(buffer, position, field_id)
            if kind == 0:
                return []
            if field_id == field and kind == _LIST:
                size, _, position = _list_header(buffer, position)
                spans = []
                for _ in range(size):
                    _, end = _struct(buffer, position, what)
                    spans.append((position, end))
                    position = end
                return spans
            if kind > _BOOL_FALSE:
                _, position = _value(buffer, position, kind, what)
    except (IndexError, struct.error):
        raise CorruptFileError(what, "thrift data ends inside a value") from None


# -- writing: only what a Parquet footer needs (i32, i64, binary, lists of those or of structs) ----------
I32, I64, BINARY, LIST, STRUCT = _I32, _I64, _BINARY, _LIST, _STRUCT


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def _zigzag(n: int) -> bytes:
    return _varint_bytes((n << 1) ^ (n >> 63))


_ONE_BYTE = [bytes((i,)) for i in range(0x80)]


def nonnegative(n: int) -> bytes:
    """The encoding of an i32 or i64 value that is not negative (a size, an offset, a count), without
    `encode_struct`'s dispatch: `row_pages.mini_parquet` encodes eight for each row group of its file."""
    n <<= 1
    return _ONE_BYTE[n] if n < 0x80 else _varint_bytes(n)


def encode_struct(fields: list[tuple[int, int, Any]], after: int = 0) -> bytes:
    """A struct of (field id, kind, value), ids ascending. A STRUCT value is its encoded bytes; a LIST value
    is (element kind, items), items encoded as the element kind (structs as their bytes). `after`: the last
    field id of the struct's beginning, encoded apart (these fields and the end go after it)."""
    out = bytearray()
    last = after
    for field_id, kind, value in fields:
        delta = field_id - last
        out += bytes([(delta << 4) | kind]) if 0 < delta <= 15 else bytes([kind]) + _zigzag(field_id)
        last = field_id
        out += _encode_value(kind, value)
    out.append(0)
    return bytes(out)


def _encode_value(kind: int, value: Any) -> bytes:
    if kind in (_I32, _I64):
        return _zigzag(value)
    if kind == _BINARY:
        return _varint_bytes(len(value)) + value
    if kind == _STRUCT:
        return value
    if kind == _LIST:
        element, items = value
        header = bytes([(len(items) << 4) | element]) if len(items) < 15 \
            else bytes([0xF0 | element]) + _varint_bytes(len(items))
        return header + b"".join(_encode_value(element, item) for item in items)
    raise ValueError(f"cannot encode thrift type {kind}")

