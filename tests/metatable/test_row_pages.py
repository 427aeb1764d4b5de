"""Reading chosen rows of base files page by page equals taking them from the whole file."""
from __future__ import annotations

import datetime
import decimal
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

from metatable.errors import CorruptFileError
from metatable.formats.key_pages import write_options
from metatable.formats.row_pages import column_reads, file_pages, mini_parquet, read_rows, read_rows_of_keys
from metatable.formats.thrift_compact import BINARY, I32, I64, LIST, STRUCT, encode_struct, leading_ints, read_struct
from metatable.storage.local import LocalStorage
from metatable.table_config import KEY_COLUMN

LOCAL = LocalStorage()

ROWS = 9_000


def sample_table(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = ROWS
    keys = np.sort(rng.choice(10 * n, n, replace=False))
    comments = [None if i % 13 == 0 else f"c{rng.integers(0, 50 if i < n // 2 else 10**9)}" + "x" * (i % 40)
                for i in range(n)]
    return pa.table({
        KEY_COLUMN: pa.array([f"k{k:08d}" for k in keys]),
        "i": pa.array(rng.integers(0, 5, n), pa.int64()),
        "small": pa.array(rng.integers(-100, 100, n), pa.int8()),
        "f": pa.array(rng.random(n)),
        "flag": pa.array(rng.random(n) < 0.5),
        "comment": pa.array(comments, pa.string()),  # low cardinality, then a dictionary that overflows
        "d": pa.array([datetime.date(2000, 1, 1) + datetime.timedelta(days=int(x)) for x in rng.integers(0, 900, n)]),
        "ts": pa.array(rng.integers(0, 10**12, n), pa.timestamp("us", tz="UTC")),
        "price": pa.array([decimal.Decimal(int(x)) / 100 for x in rng.integers(0, 10**7, n)], pa.decimal128(15, 2)),
        # decimals in 4, 16 and 21 bytes: negative, null, few values (dictionary-encoded) or many
        "signed": pa.array([None if i % 7 == 0 else decimal.Decimal(int(x)).scaleb(-3)
                            for i, x in enumerate(rng.integers(-50, 50, n))], pa.decimal128(9, 3)),
        "wide": pa.array([decimal.Decimal(int(x) * 10**20 + int(x)) for x in rng.integers(-10**15, 10**15, n)],
                         pa.decimal128(38, 0)),
        "huge": pa.array([decimal.Decimal(int(x)).scaleb(-5) for x in rng.integers(-10**15, 10**15, n)],
                         pa.decimal256(50, 5)),
        # columns of a kind with others (`row_pages._Kind`): their pages decode together with those of "i",
        # "comment" (while both are dictionary-encoded) and "price"
        "j": pa.array(rng.integers(-10**12, 10**12, n), pa.int64()),
        "note": pa.array([None if i % 5 == 0 else f"n{rng.integers(0, 6)}" for i in range(n)], pa.string()),
        "cost": pa.array([decimal.Decimal(int(x)) / 100 for x in rng.integers(0, 500, n)], pa.decimal128(15, 2)),
    })


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = []
    # one row group, then several; the third file's pages are another codec's, so they join no row group of
    # the others' in a read of all three (`_read_column`)
    for seed, row_group, codec in ((1, ROWS, "zstd"), (2, 2_500, "zstd"), (3, 4_000, "snappy")):
        table = sample_table(seed)
        path = str(tmp_path_factory.mktemp("pages") / f"f{seed}.parquet")
        pq.write_table(table, path, row_group_size=row_group,
                       **write_options(table, codec, "lz4_raw", 1024))
        out.append((path, table))
    return out


def test_pages_are_short_and_indexed(files):
    path, _ = files[1]
    pages = file_pages(LOCAL, path)
    assert len(pages.row_groups) == 4 and pages.row_starts == (0, 2500, 5000, 7500)
    assert max(int(np.diff(np.r_[c.first_rows, c.rows]).max()) for g in pages.row_groups for c in g) <= 2048
    encodings = pq.ParquetFile(files[0][0]).metadata.row_group(0).column(pages.names.index("comment")).encodings
    assert "PLAIN" in encodings and "RLE_DICTIONARY" in encodings, "the comment dictionary overflowed to PLAIN"


def test_a_damaged_page_among_many_files_names_its_file(files, tmp_path):
    """The pages of many files decode together, in one row group where they can: a page that does not
    decode names its own file, not the first of the read."""
    copies = []
    for i, (path, _) in enumerate(files[:2] * 2):
        copy = str(tmp_path / f"c{i}.parquet")
        shutil.copy(path, copy)
        copies.append(copy)
    damaged = copies[2]
    pages = file_pages(LOCAL, damaged)
    chunk = pages.row_groups[0][pages.names.index("f")]
    offset, size = int(chunk.offsets[1]), int(chunk.sizes[1])
    data = bytearray(open(damaged, "rb").read())
    data[offset + size - 3] ^= 0xFF  # inside the page's values: its checksum no longer holds
    open(damaged, "wb").write(data)
    rows = int(chunk.first_rows[1]) + np.arange(3)
    wanted = [(file_pages(LOCAL, copy), rows) for copy in copies]
    [read] = column_reads(wanted[0][0], rows, [pages.names.index("f")])
    assert [run.dictionary for run in read.runs] == [None]
    with pytest.raises(CorruptFileError) as raised:
        read_rows(wanted, ["i", "f"])
    assert raised.value.path == damaged


@settings(max_examples=40, deadline=None)
@given(picks=st.lists(st.lists(st.integers(0, ROWS - 1), max_size=30, unique=True), min_size=3, max_size=3),
       columns=st.lists(st.sampled_from(["i", "small", "f", "flag", "comment", "d", "ts", "price", "signed", "wide",
                                         "huge", "j", "note", "cost", KEY_COLUMN]), min_size=1, max_size=15,
                        unique=True))
def test_read_rows_equals_take(files, picks, columns):
    wanted = [(file_pages(LOCAL, path), np.array(sorted(rows), dtype=np.int64)) for (path, _), rows in zip(files, picks)]
    got = read_rows(wanted, columns)
    for (path, table), (_, rows), part in zip(files, wanted, got):
        expected = table.select(columns).take(rows)
        assert part.num_rows == len(rows)
        assert part.cast(expected.schema).equals(expected), path
        decimals = {"price", "signed", "wide", "huge", "cost"} & set(columns) if len(rows) else set()
        for name in decimals:  # decimals come as decimals, not as the bytes they are stored in
            assert part.schema.field(name).type == table.schema.field(name).type


@settings(max_examples=30, deadline=None)
@given(picks=st.lists(st.integers(0, ROWS - 1), min_size=1, max_size=20, unique=True),
       absent=st.lists(st.integers(0, 10 * ROWS), max_size=5))
def test_rows_of_keys_finds_exactly_the_held_keys(files, picks, absent):
    for path, table in files:
        held = set(table[KEY_COLUMN].to_pylist())
        keys = [table[KEY_COLUMN][i].as_py() for i in picks] + [f"k{a:08d}" for a in absent]
        [got] = read_rows_of_keys(LOCAL, [path], [pa.array(keys)], ["i", KEY_COLUMN, "comment"])
        expected = sorted(i for i, k in enumerate(table[KEY_COLUMN].to_pylist()) if k in set(keys) & held)
        assert got.column_names == ["i", KEY_COLUMN, "comment"]
        assert got.equals(table.select(got.column_names).take(expected))


def test_a_mini_file_is_a_parquet_file_of_the_chosen_pages(files):
    """Two pages of one column, copied with the dictionary page: pyarrow reads exactly their rows."""
    path, table = files[0]
    pages = file_pages(LOCAL, path)
    chunk = pages.row_groups[0][pages.names.index("i")]
    with open(path, "rb") as f:
        raw = f.read()
    chosen = [0, 2]
    data = [raw[chunk.offsets[p]:chunk.offsets[p] + chunk.sizes[p]] for p in chosen]
    offset, size = chunk.dictionary
    ends = np.r_[chunk.first_rows[1:], chunk.rows]
    rows = int(sum(ends[p] - chunk.first_rows[p] for p in chosen))
    got = pq.read_table(pa.BufferReader(mini_parquet(pages.elements[pages.names.index("i")],
                                                     [(chunk.meta, raw[offset:offset + size], data, rows)])))
    expected = pa.concat_arrays([table["i"].combine_chunks()[chunk.first_rows[p]:ends[p]] for p in chosen])
    assert got["i"].combine_chunks().equals(expected)


def generic_mini_parquet(element: bytes, groups: list[tuple[bytes, bytes | None, list[bytes], int]]) -> bytes:
    """The model: `mini_parquet`'s file with every struct through `encode_struct`."""
    def uncompressed(page: bytes) -> int:
        sizes = leading_ints(page, 3)
        return len(page) if sizes is None else len(page) - sizes[2] + sizes[1]
    out, row_groups, total = bytearray(b"PAR1"), [], 0
    for meta, dictionary, pages, rows in groups:
        start, dictionary_offset = len(out), None
        if dictionary is not None:
            dictionary_offset = len(out)
            out += dictionary
        data_offset = len(out)
        for page in pages:
            out += page
        stored = len(out) - start
        fields = [(5, I64, rows), (6, I64, sum(uncompressed(p) for p in ([dictionary] if dictionary else []) + pages)),
                  (7, I64, stored), (9, I64, data_offset)] + \
            ([(11, I64, dictionary_offset)] if dictionary_offset is not None else [])
        chunk = encode_struct([(2, I64, start), (3, STRUCT, meta + encode_struct(fields, after=4))])
        row_groups.append(encode_struct([(1, LIST, (STRUCT, [chunk])), (2, I64, stored), (3, I64, rows)]))
        total += rows
    root = encode_struct([(4, BINARY, b"schema"), (5, I32, 1)])
    footer = encode_struct([(1, I32, 1), (2, LIST, (STRUCT, [root, element])), (3, I64, total),
                            (4, LIST, (STRUCT, row_groups))])
    return bytes(out + footer + len(footer).to_bytes(4, "little") + b"PAR1")


PAGE = st.one_of(st.binary(max_size=300), st.integers(0, 2**31 - 1).map(
    lambda n: encode_struct([(1, I32, 0), (2, I32, n), (3, I32, 40)])[:-1] + b"\x00" * 40))  # a header's sizes
GROUP = st.tuples(st.binary(max_size=40), st.one_of(st.none(), PAGE), st.lists(PAGE, max_size=4),
                  st.integers(0, 2**40))


@settings(max_examples=300, deadline=None)
@given(element=st.binary(max_size=30), groups=st.lists(GROUP, max_size=5),
       padding=st.integers(0, 2**20))
def test_mini_parquet_encodes_what_encode_struct_encodes(element, groups, padding):
    """Its row groups, joined from field headers and values, are byte for byte `encode_struct`'s, with offsets
    and counts of one to six varint bytes (`padding` grows the first page)."""
    if groups and groups[0][2]:
        meta, dictionary, pages, rows = groups[0]
        groups = [(meta, dictionary, [pages[0] + b"\x00" * padding, *pages[1:]], rows), *groups[1:]]
    assert mini_parquet(element, groups) == generic_mini_parquet(element, groups)


def test_a_read_takes_the_dictionary_page_only_for_dictionary_encoded_pages(files):
    """The leading dictionary-encoded pages that the encoding stats count are those whose own headers say so;
    rows of the PLAIN pages after a dictionary overflowed are read without the dictionary page, and equal."""
    for path, table in files:
        pages = file_pages(LOCAL, path)
        column = pages.names.index("comment")
        with open(path, "rb") as f:
            raw = f.read()
        for start, group in zip(pages.row_starts, pages.row_groups):
            chunk = group[column]
            encoded = []
            for offset in chunk.offsets:
                header, _ = read_struct(raw, int(offset), path)
                encoded.append((header.get(5) or header.get(8))[2 if 5 in header else 4] in (2, 8))
            assert encoded == [i < chunk.dictionary_pages for i in range(len(encoded))], path
        overflowed = [(start, group[column]) for start, group in zip(pages.row_starts, pages.row_groups)
                      if 0 < group[column].dictionary_pages < len(group[column].offsets)]
        assert overflowed, "a comment dictionary overflowed to PLAIN"
        start, chunk = overflowed[0]
        plain = start + int(chunk.first_rows[chunk.dictionary_pages]) + np.arange(5)
        [read] = column_reads(pages, plain, [column])
        assert [run.dictionary for run in read.runs] == [None] and chunk.dictionary[::-1] not in read.ranges()
        [read] = column_reads(pages, np.r_[start, plain], [column])  # the chunk's first page is dictionary-encoded
        assert [run.dictionary for run in read.runs] == [chunk.dictionary[::-1]]
        assert chunk.dictionary[::-1] in read.ranges()
        for rows in (plain, np.r_[start, plain]):
            [got] = read_rows([(pages, rows)], ["comment"])
            assert got["comment"].combine_chunks().equals(table["comment"].combine_chunks().take(rows)), path


def test_rows_of_dictionary_encoded_string_pages_come_as_plain_strings(files):
    """Rows whose pages are all dictionary-encoded are decoded as a dictionary and taken before their values
    are: they come as the column's own strings, nulls included, alone and beside rows of PLAIN pages."""
    for path, table in files:
        pages = file_pages(LOCAL, path)
        column = pages.names.index("comment")
        chunk = pages.row_groups[0][column]
        assert chunk.dictionary_pages > 1, path
        dictionary_rows = np.arange(0, int(chunk.first_rows[chunk.dictionary_pages - 1]) + 1, 13)  # nulls: i % 13
        plain = int(chunk.first_rows[chunk.dictionary_pages]) if chunk.dictionary_pages < len(chunk.offsets) else None
        for rows in (dictionary_rows, dictionary_rows[:1], np.r_[dictionary_rows, plain] if plain else dictionary_rows):
            [got] = read_rows([(pages, rows)], ["comment", "i"])
            assert got.schema.field("comment").type == pa.string()
            assert got["comment"].null_count > 0 or len(rows) == 1
            assert got["comment"].combine_chunks().equals(table["comment"].combine_chunks().take(rows)), path
