"""A reader for Thrift's compact protocol, enough to decode Parquet's footer, page index and page headers.

pyarrow parses Parquet footers but does not expose the page index (where each page of a column
starts, and its min/max), which point lookups need. A struct decodes to a dict from field id to value;
lists and sets to lists; maps to dicts; binaries stay bytes. Unknown fields cost nothing to carry.
"""
from __future__ import annotations

import struct
from typing import Any

from .errors import CorruptFileError

_DOUBLE = struct.Struct("<d")
_BOOL_TRUE, _BOOL_FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE_T, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


class CompactReader:
    def __init__(self, buffer: bytes, position: int, what: str) -> None:
        self.buffer = buffer
        self.position = position
        self.what = what

    def _varint(self) -> int:
        result = shift = 0
        while True:
            byte = self._byte()
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result
            shift += 7

    def _zigzag(self) -> int:
        n = self._varint()
        return (n >> 1) ^ -(n & 1)

    def _byte(self) -> int:
        try:
            byte = self.buffer[self.position]
        except IndexError:
            raise CorruptFileError(self.what, "thrift data ends inside a value") from None
        self.position += 1
        return byte

    def _bytes(self, n: int) -> bytes:
        start = self.position
        self.position += n
        if self.position > len(self.buffer):
            raise CorruptFileError(self.what, "thrift data ends inside a value")
        return self.buffer[start:self.position]

    def _value(self, kind: int) -> Any:
        if kind in (_I16, _I32, _I64):
            return self._zigzag()
        if kind == _BINARY:
            return self._bytes(self._varint())
        if kind == _STRUCT:
            return self.read_struct()
        if kind in (_LIST, _SET):
            header = self._byte()
            size, element = header >> 4, header & 0x0F
            if size == 15:
                size = self._varint()
            if element in (_BOOL_TRUE, _BOOL_FALSE):  # booleans in containers take one byte each
                return [b == _BOOL_TRUE for b in self._bytes(size)]
            return [self._value(element) for _ in range(size)]
        if kind == _MAP:
            size = self._varint()
            if not size:
                return {}
            types = self._byte()
            return {self._value(types >> 4): self._value(types & 0x0F) for _ in range(size)}
        if kind == _BYTE:
            return int.from_bytes(self._bytes(1), "little", signed=True)
        if kind == _DOUBLE_T:
            return _DOUBLE.unpack(self._bytes(8))[0]
        raise CorruptFileError(self.what, f"unknown thrift type {kind} at byte {self.position}")

    def read_struct(self) -> dict[int, Any]:
        fields: dict[int, Any] = {}
        field_id = 0
        while True:
            header = self._byte()
            kind = header & 0x0F
            if kind == 0:
                return fields
            delta = header >> 4
            field_id = field_id + delta if delta else self._zigzag()
            if kind in (_BOOL_TRUE, _BOOL_FALSE):
                fields[field_id] = kind == _BOOL_TRUE
            else:
                fields[field_id] = self._value(kind)


def read_struct(buffer: bytes, position: int, what: str) -> tuple[dict[int, Any], int]:
    """The struct at `position` of `buffer` (read from the file `what`) and the position just after it."""
    reader = CompactReader(buffer, position, what)
    return reader.read_struct(), reader.position
