"""The compact-protocol reader against an encoder written from the spec, and against pyarrow's footers."""
from __future__ import annotations

import struct

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metatable.errors import CorruptFileError
import metatable.formats.thrift_compact as thrift_compact
from metatable.formats.thrift_compact import (leading_ints, leading_list_size, page_locations, page_locations_many,
                                              read_struct)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        if n < 0x80:
            return bytes(out + bytes([n]))
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def _zigzag(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))


def _kind(value) -> int:
    if isinstance(value, bool):
        return 1
    if isinstance(value, int):
        return 6
    if isinstance(value, float):
        return 7
    if isinstance(value, bytes):
        return 8
    if isinstance(value, list):
        return 9
    return 12


def _encode_value(value) -> bytes:
    kind = _kind(value)
    if kind == 6:
        return _zigzag(value)
    if kind == 7:
        return struct.pack("<d", value)
    if kind == 8:
        return _varint(len(value)) + value
    if kind == 9:
        element = _kind(value[0]) if value else 6
        header = bytes([(len(value) << 4) | element]) if len(value) < 15 else bytes([0xF0 | element]) + _varint(len(value))
        if element == 1:
            return header + bytes(1 if v else 2 for v in value)
        return header + b"".join(_encode_value(v) for v in value)
    return encode_struct(value)


def encode_struct(fields: dict[int, object]) -> bytes:
    out = bytearray()
    last = 0
    for field_id in sorted(fields):
        value = fields[field_id]
        kind = _kind(value)
        if kind == 1:
            kind = 1 if value else 2
        delta = field_id - last
        out += bytes([(delta << 4) | kind]) if 0 < delta <= 15 else bytes([kind]) + _zigzag(field_id)
        if _kind(value) != 1:
            out += _encode_value(value)
        last = field_id
    return bytes(out + b"\x00")


scalars = st.one_of(st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1), st.binary(max_size=40),
                    st.floats(allow_nan=False))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(st.booleans(), max_size=20), st.lists(st.integers(-(2 ** 31), 2 ** 31), max_size=20),
    st.lists(st.integers(-(2 ** 63), 2 ** 63 - 1), max_size=5),  # varints of one byte to ten
    st.lists(st.binary(max_size=8), max_size=20), st.lists(st.binary(max_size=200), max_size=3),
    st.dictionaries(st.integers(1, 300), inner, max_size=5)), max_leaves=12)
structs = st.dictionaries(st.integers(1, 300), values, max_size=8)


@settings(max_examples=300)
@given(structs)
def test_decodes_what_the_spec_encodes(fields):
    data = b"junk" + encode_struct(fields) + b"tail"
    decoded, end = read_struct(data, 4, "test")
    assert decoded == fields
    assert data[end:] == b"tail"


@given(structs.filter(bool))
def test_truncated_data_is_a_corrupt_file(fields):
    data = encode_struct(fields)
    with pytest.raises(CorruptFileError, match="some.parquet"):
        read_struct(data[:-1], 0, "some.parquet")


def test_reads_a_parquet_footer_like_pyarrow(tmp_path):
    path = str(tmp_path / "f.parquet")
    table = pa.table({"a": pa.array(range(5000)), "b": pa.array([f"v{i}" for i in range(5000)])})
    pq.write_table(table, path, row_group_size=2000, write_page_index=True, compression="zstd")
    data = open(path, "rb").read()
    length = int.from_bytes(data[-8:-4], "little")
    footer, end = read_struct(data, len(data) - 8 - length, path)
    assert end == len(data) - 8
    metadata = pq.read_metadata(path)
    assert footer[3] == metadata.num_rows
    assert len(footer[4]) == metadata.num_row_groups == 3
    assert [element[4] for element in footer[2][1:]] == [b"a", b"b"]
    for g, row_group in enumerate(footer[4]):
        assert row_group[3] == metadata.row_group(g).num_rows
        for c, chunk in enumerate(row_group[1]):
            assert chunk[3][3] == [metadata.row_group(g).column(c).path_in_schema.encode()]
            assert chunk[3][4] == 6  # ZSTD
            assert chunk[4] > 0 and chunk[6] > 0  # offset and column index are there


@given(structs)
def test_leading_ints_are_the_first_fields_when_they_are_integers(fields):
    ints = [fields.get(i) for i in (1, 2, 3)]
    expected = ints if all(isinstance(v, int) and not isinstance(v, bool) for v in ints) else None
    assert leading_ints(encode_struct(fields), 3) == expected


@pytest.mark.parametrize("pages", [0, 1, 14, 15, 4447])
def test_leading_list_size_counts_an_offset_index_without_its_pages(pages):
    offset_index = encode_struct({1: [{1: 4 + i, 2: 100, 3: i} for i in range(pages)]})  # PageLocations
    assert leading_list_size(offset_index[:16]) == pages == len(read_struct(offset_index, 0, "x")[0][1])
    assert leading_list_size(encode_struct({2: 7})) is None  # not a list in field 1
    assert leading_list_size(encode_struct({1: 7})) is None
    assert leading_list_size(offset_index[:1]) is None  # cut inside the header


def _location(offset: int, size: int, first_row: int, size_kind: int = 5) -> bytes:
    """A PageLocation as writers encode it (`size_kind` 6 encodes the i32 as an i64: legal, not uniform)."""
    return (bytes([0x16]) + _zigzag(offset) + bytes([0x10 | size_kind]) + _zigzag(size) + bytes([0x16])
            + _zigzag(first_row) + b"\x00")


def _offset_index(locations: list[tuple[int, int, int]], size_kind: int = 5,
                  unencoded: list[int] | None = None) -> bytes:
    count = len(locations)
    header = bytes([0x19, (count << 4) | 12]) if count < 15 else bytes([0x19, 0xFC]) + _varint(count)
    body = b"".join(_location(*location, size_kind) for location in locations)
    trailer = b"" if unencoded is None else bytes([0x19]) + _encode_value(unencoded)  # field 2, list<i64>
    return header + body + trailer + b"\x00"


locations = st.lists(st.tuples(st.integers(-(2 ** 63), 2 ** 63 - 1), st.integers(-(2 ** 31), 2 ** 31 - 1),
                               st.integers(-(2 ** 63), 2 ** 63 - 1)), max_size=40)


@settings(max_examples=300)
@given(locations, st.sampled_from([5, 6]), st.one_of(st.none(), st.lists(st.integers(0, 2 ** 40), min_size=1,
                                                                            max_size=5)))
def test_page_locations_are_the_decoded_offset_index(pages, size_kind, unencoded):
    """Both ways of decoding (numpy over the uniform encoding, `read_struct` over any other) give what was
    encoded, also with the optional list that follows the locations."""
    data = _offset_index(pages, size_kind, unencoded)
    decoded = page_locations(data, "x")
    assert [column.tolist() for column in decoded] == [[page[k] for page in pages] for k in range(3)]
    assert all(column.dtype == "int64" for column in decoded)


@settings(max_examples=200)
@given(st.lists(st.tuples(locations.filter(bool), st.sampled_from([5, 5, 6]),
                          st.one_of(st.none(), st.lists(st.integers(0, 2 ** 40), min_size=1, max_size=3))),
                min_size=1, max_size=6))
def test_many_offset_indexes_decode_as_each_alone(indexes):
    """Decoded together (one numpy pass, or each alone when one is not uniform), each offset index gives what
    it encodes."""
    buffers = [_offset_index(pages, size_kind, unencoded) for pages, size_kind, unencoded in indexes]
    decoded = page_locations_many(buffers, "x")
    assert [[column.tolist() for column in one] for one in decoded] == \
        [[[page[k] for page in pages] for k in range(3)] for pages, _, _ in indexes]


def test_page_locations_of_pyarrow_files_decode_with_numpy(tmp_path, monkeypatch):
    path = str(tmp_path / "f.parquet")
    table = pa.table({"a": pa.array(range(50_000)), "b": pa.array([f"v{i}" for i in range(50_000)])})
    pq.write_table(table, path, row_group_size=20_000, write_page_index=True, data_page_size=1024,
                   use_dictionary=False, write_batch_size=128)
    data = open(path, "rb").read()
    length = int.from_bytes(data[-8:-4], "little")
    footer, _ = read_struct(data, len(data) - 8 - length, path)
    expected = [read_struct(data[chunk[4]:chunk[4] + chunk[5]], 0, path)[0][1]
                for row_group in footer[4] for chunk in row_group[1]]
    monkeypatch.setattr(thrift_compact, "read_struct", None)  # the generic decoder must not be needed
    for row_group in footer[4]:
        buffers = [data[chunk[4]:chunk[4] + chunk[5]] for chunk in row_group[1]]
        for (offsets, sizes, first_rows), alone in zip(page_locations_many(buffers, path), buffers):
            pages = expected.pop(0)
            assert len(pages) > 15  # a long list header
            assert (offsets.tolist(), sizes.tolist(), first_rows.tolist()) == \
                ([p[1] for p in pages], [p[2] for p in pages], [p[3] for p in pages])
            assert [a.tolist() for a in page_locations(alone, path)] == [offsets.tolist(), sizes.tolist(),
                                                                        first_rows.tolist()]


@given(locations.filter(bool), st.integers(1, 200))
def test_a_cut_offset_index_is_a_corrupt_file(pages, cut):
    data = _offset_index(pages)
    with pytest.raises(CorruptFileError, match="some.parquet"):
        page_locations(data[:max(len(data) - cut, 1)], "some.parquet")
