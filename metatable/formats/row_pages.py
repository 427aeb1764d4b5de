"""Reading chosen rows of base files without reading their columns whole.

Base files keep a page index (`key_pages.write_options`). For every column it says where each page lies
and which row it starts at. pyarrow decodes whole column chunks and cannot skip pages, so the pages
that hold the wanted rows are copied here into a small Parquet file made in memory: one column, one row
group per source column chunk with its dictionary page, and a footer written with `thrift_compact`.
pyarrow then decodes only those pages. One such file per column serves every base file a call touches.

`Table.get` reads rows this way. It probes a key page per key (`KeyPages.probe`), then decodes the key pages
that hold the keys, the same way, to find their rows.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metatable.errors import CorruptFileError
from metatable.formats.key_pages import OpenFile, cached_per_file, footer_fields, key_pages, open_read, parquet_footer
from metatable.formats.thrift_compact import (
    BINARY, I32, I64, LIST, STRUCT, encode_struct, field_span, leading_ints, nonnegative, page_locations_many,
    read_struct, struct_spans)
from metatable.parallel import thread_map
from metatable.storage.base import Storage
from metatable.table_config import KEY_COLUMN

_DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY
_DATA_PAGES = (0, 3)  # DATA_PAGE, DATA_PAGE_V2
_BYTE_ARRAY = 6  # the physical type of strings and binaries
_FIXED_LEN_BYTE_ARRAY = 7
_DECIMAL = 5  # ConvertedType, and the LogicalType union's field
FEW_ROWS = 8  # a read of fewer rows decodes its pages in the calling thread (`parallel.thread_map`)
_COPY_NAME = b"v"  # the column of every copy of pages (`mini_parquet`): one name for columns of one kind


@dataclass(frozen=True)
class ChunkPages:
    """One column chunk (a column of one row group): its data pages, and its dictionary page if any."""

    meta: bytes  # the ColumnMetaData fields the copy keeps (type, encodings, path, codec), encoded: `column_meta`
    dictionary: tuple[int, int] | None  # (offset, size)
    offsets: np.ndarray
    sizes: np.ndarray
    first_rows: np.ndarray  # first row of each page, within the row group
    rows: int
    dictionary_pages: int  # the leading data pages that are dictionary-encoded (`dictionary_encoded_pages`)

    @functools.cached_property
    def ends(self) -> np.ndarray:
        """The row after each page's last."""
        return np.append(self.first_rows[1:], self.rows)


_ROW_BITS = 40  # a page's place in `PageIndex.keys`: its column above these bits, its first file row below
_ROW_MASK = (1 << _ROW_BITS) - 1


@dataclass(frozen=True)
class PageIndex:
    """Every data page of a base file, of every column, in one set of arrays ordered by (column, first file
    row): one `searchsorted` finds the page of every (column, row) a read wants (`column_reads`). They were
    found column chunk by column chunk, ~20 numpy calls each, and a `by_part` query asks 19 files for 18
    columns: its column reads, replayed, took 15.4-19.1 ms so and 10.9-11.9 ms now (with the row groups
    `_read_kind` joins, and the key column taken from the key read, `read_rows_of_keys`)."""

    keys: np.ndarray  # column << _ROW_BITS | the page's first file row
    rows: np.ndarray  # rows in each page
    offsets: np.ndarray
    sizes: np.ndarray
    chunks: np.ndarray  # each page's column chunk, its number in `column_chunks`
    dictionary_encoded: np.ndarray  # whether the page needs its chunk's dictionary page
    column_chunks: tuple[ChunkPages, ...]  # in (column, row group) order
    chunk_columns: np.ndarray  # each chunk's column


@dataclass(frozen=True)
class ChunkRun:
    """Chosen pages of one column chunk: their (length, offset) ranges, its dictionary page's when they need
    it, and their rows."""

    meta: bytes  # `ChunkPages.meta`
    pages: list[tuple[int, int]]
    dictionary: tuple[int, int] | None
    rows: int


@dataclass(frozen=True)
class ColumnRead:
    """What reading chosen rows of one column of a file takes: the chosen pages, chunk by chunk, and where each
    wanted row is among their values once decoded."""

    runs: list[ChunkRun]
    positions: np.ndarray
    dictionary_only: bool  # every chosen page is dictionary-encoded

    def ranges(self) -> list[tuple[int, int]]:
        """(length, offset) of every page the read needs, each run's pages then its dictionary page."""
        return [r for run in self.runs for r in (run.pages + [run.dictionary] if run.dictionary else run.pages)]


@dataclass(frozen=True)
class FilePages:
    """Where every page of every column of a base file lies."""

    storage: Storage
    path: str
    names: tuple[str, ...]
    elements: tuple[bytes, ...]  # each column's SchemaElement, as thrift bytes to copy
    row_groups: tuple[tuple[ChunkPages, ...], ...]
    row_starts: tuple[int, ...]  # first file row of each row group

    def key_rows_of_pages(self, flat_pages: Sequence[int]) -> np.ndarray:
        """The file rows of key-column pages numbered across row groups (as `KeyPages` numbers them)."""
        column = self.names.index(KEY_COLUMN)
        rows, first = [], 0
        for start, group in zip(self.row_starts, self.row_groups):
            chunk = group[column]
            for page in (p - first for p in flat_pages if first <= p < first + len(chunk.offsets)):
                rows.append(np.arange(start + chunk.first_rows[page], start + chunk.ends[page]))
            first += len(chunk.offsets)
        return np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)

    @functools.cached_property
    def page_index(self) -> PageIndex:
        """Every page of the file in one set of arrays (`PageIndex`)."""
        chunks = [group[column] for column in range(len(self.names)) for group in self.row_groups]
        starts = np.array(self.row_starts * len(self.names), dtype=np.int64)
        columns = np.repeat(np.arange(len(self.names), dtype=np.int64), len(self.row_groups))
        counts = np.array([len(chunk.offsets) for chunk in chunks], dtype=np.int64)
        first_rows = np.concatenate([chunk.first_rows for chunk in chunks]).astype(np.int64)
        rows = np.concatenate([chunk.ends - chunk.first_rows for chunk in chunks]).astype(np.int64)
        within = np.arange(len(first_rows)) - np.repeat(np.cumsum(counts) - counts, counts)  # place in its chunk
        dictionary_pages = np.array([chunk.dictionary_pages if chunk.dictionary else 0 for chunk in chunks])
        return PageIndex(keys=np.repeat(columns << _ROW_BITS | starts, counts) + first_rows, rows=rows,
                         offsets=np.concatenate([chunk.offsets for chunk in chunks]).astype(np.int64),
                         sizes=np.concatenate([chunk.sizes for chunk in chunks]).astype(np.int64),
                         chunks=np.repeat(np.arange(len(chunks)), counts),
                         dictionary_encoded=within < np.repeat(dictionary_pages, counts),
                         column_chunks=tuple(chunks), chunk_columns=columns)


@cached_per_file(maxsize=512)
@footer_fields
def file_pages(storage: Storage, path: str) -> FilePages | None:
    """The page layout of a base file, or None when it cannot serve row reads (a nested schema, a column
    chunk without an offset index). Cached per file identity (`cached_per_file`)."""
    parsed = parquet_footer(storage, path)
    raw, footer = parsed.raw, parsed.fields
    with open_read(storage, path) as file:
        spans = struct_spans(raw, 0, 2, path)
        schema = footer.get(2, [])
        if any(element.get(5) for element in schema[1:]):
            return None
        names = tuple(element[4].decode() for element in schema[1:])
        elements = tuple(raw[a:b] for a, b in spans[1:])
        chunk_lists = [row_group[1] for row_group in footer.get(4, [])]
        if any(4 not in chunk for chunks in chunk_lists for chunk in chunks):
            return None
        indexes = iter(page_locations_many(
            file.read_many([(chunk[5], chunk[4]) for chunks in chunk_lists for chunk in chunks]), path))
        groups, starts, start = [], [], 0
        for row_group in footer.get(4, []):
            chunks = []
            for chunk in row_group[1]:
                meta = chunk[3]
                offsets, sizes, firsts = next(indexes)
                dictionary = (meta[11], meta[9] - meta[11]) if meta.get(11) else None
                chunks.append(ChunkPages(column_meta(meta), dictionary, offsets, sizes, firsts,
                                         row_group[3], dictionary_encoded_pages(meta, len(offsets))))
            groups.append(tuple(chunks))
            starts.append(start)
            start += row_group[3]
    return FilePages(storage, path, names, elements, tuple(groups), tuple(starts))


def read_rows(wanted: Sequence[tuple[FilePages, np.ndarray]], columns: Sequence[str]) -> list[pa.Table]:
    """For each (file, ascending file rows): those rows of `columns`, the pages that hold them copied into
    small Parquet files, one per kind of column (`_Kind`), each decoded once. On an object store every page a
    file's rows need, of every column, is fetched first in one call (`Storage.read_ranges`: near pages in one
    request, the others in parallel): read column by column, a `get` of 1,000 keys at SF 0.1 made 296 ranged
    requests."""
    reads = [_file_reads(pages, rows, columns) for pages, rows in wanted]
    fetched = _prefetched(wanted, reads)
    out: list[dict[str, pa.Array]] = [{} for _ in wanted]
    kinds = _kinds(wanted, reads, columns)
    with contextlib.ExitStack() as stack:
        files = {pages.path: stack.enter_context(open_read(pages.storage, pages.path)) for pages, _ in wanted}
        # decoding frees the GIL
        parallel = sum(len(rows) for _, rows in wanted) >= FEW_ROWS
        for kind, arrays in zip(kinds, thread_map(lambda kind: _read_kind(wanted, reads, kind, files, fetched),
                                                  kinds, parallel)):
            for (name, i), array in zip(kind.pieces, arrays):
                out[i][name] = array
    # nulls for a column added after the file was written
    return [pa.table({name: arrays.get(name, pa.nulls(len(rows))) for name in columns})
            for arrays, (_, rows) in zip(out, wanted)]


@dataclass(frozen=True)
class _Kind:
    """Columns whose pages decode together: one schema element once named alike (`_unnamed`), and for strings,
    whether every page read is dictionary-encoded (`_decode`). The pages of a `get_by`'s one row took 17
    decodes, one per lineitem column, ~40 us of pyarrow and ~60 us of Python each."""

    element: bytes
    dictionary: bool
    pieces: tuple[tuple[str, int], ...]  # (column, file number) in the order of the decoded rows


def _kinds(wanted: Sequence[tuple[FilePages, np.ndarray]], reads: Sequence[dict[str, ColumnRead]],
           columns: Sequence[str]) -> list[_Kind]:
    """Every (column, file) to read, by the kind its pages decode as."""
    only: dict[tuple[str, bytes], bool] = {}  # (column, element) -> every page read is dictionary-encoded
    pieces = []
    for name in columns:
        for i, ((pages, _), file_reads) in enumerate(zip(wanted, reads)):
            if name in pages.names:
                element = pages.elements[pages.names.index(name)]
                read = file_reads.get(name)
                only[name, element] = only.get((name, element), True) and (read is None or read.dictionary_only)
                pieces.append((name, i, element))
    kinds: dict[tuple[bytes, bool], list[tuple[str, int]]] = {}
    for name, i, element in pieces:
        strings = leading_ints(element, 1) == [_BYTE_ARRAY]
        kinds.setdefault((_unnamed(element), strings and only[name, element]), []).append((name, i))
    return [_Kind(element, dictionary, tuple(kind_pieces)) for (element, dictionary), kind_pieces in kinds.items()]


@functools.lru_cache(maxsize=1024)
def _unnamed(element: bytes) -> bytes:
    """A column's schema element under the name of every copy's column (`_COPY_NAME`)."""
    start, end = field_span(element, 4, "a schema element") or (0, 0)
    if not end:
        raise CorruptFileError("a schema element", "it has no name")
    return element[:start] + bytes([len(_COPY_NAME)]) + _COPY_NAME + element[end:]


def _file_reads(pages: FilePages, rows: np.ndarray, columns: Sequence[str]) -> dict[str, ColumnRead]:
    """What reading `rows` of each of `columns` the file has takes (`column_reads`)."""
    present = [name for name in columns if name in pages.names]
    if not len(rows) or not present:
        return {}
    return dict(zip(present, column_reads(pages, rows, [pages.names.index(name) for name in present])))


def dictionary_encoded_pages(meta: dict, pages: int) -> int:
    """How many of a column chunk's data pages, from its first, are dictionary-encoded: the count its encoding
    stats give (ColumnMetaData field 13). The writer falls back to PLAIN once for good when the dictionary
    outgrows its limit (`key_pages.DICTIONARY_PAGE_LIMIT`), so those pages lead, and a read of later pages needs
    no dictionary page. A key-sorted `l_orderkey` repeats in its first 256 values and keeps a dictionary that
    overflows at ~64 KB after a few pages: every row read from such a file read that page too. Without the
    stats, every page may need it."""
    stats = meta.get(13)
    if stats is None:
        return pages
    return sum(s.get(3, 0) for s in stats if s.get(1) in _DATA_PAGES and s.get(2) in _DICTIONARY_ENCODINGS)


def column_reads(pages: FilePages, rows: np.ndarray, columns: Sequence[int]) -> list[ColumnRead]:
    """For each of `columns` (the file's column numbers), what reading the (ascending, at least one) file `rows`
    of it takes: all columns' pages found at once (`PageIndex`)."""
    index = pages.page_index
    ordered = np.array(sorted(set(columns)), dtype=np.int64)
    if len(rows) == 1:
        return _one_row_reads(index, int(rows[0]), ordered, columns)
    wanted = (ordered[:, None] << _ROW_BITS | rows).ravel()
    page = index.keys.searchsorted(wanted, side="right") - 1
    chosen = page[_starts(page)]  # ascending by (column, row), as `wanted` is
    counts = index.rows[chosen]
    begins = np.cumsum(counts) - counts
    slot = np.cumsum(_starts(page)) - 1
    positions = (begins[slot] + wanted - index.keys[page]).reshape(len(ordered), len(rows))
    positions -= begins[slot[::len(rows)]][:, None]  # each column's rows counted from its first chosen page
    encoded = index.dictionary_encoded[chosen]
    chunk_of = index.chunks[chosen]
    run_starts = np.flatnonzero(_starts(chunk_of))
    run_rows = np.add.reduceat(counts, run_starts).tolist()
    run_needs = np.logical_or.reduceat(encoded, run_starts).tolist()
    run_chunks = chunk_of[run_starts]
    column_runs = np.searchsorted(index.chunk_columns[run_chunks], ordered).tolist() + [len(run_starts)]
    column_only = np.logical_and.reduceat(encoded, slot[::len(rows)]).tolist()
    bounds = run_starts.tolist() + [len(chosen)]
    ranges = list(zip(index.sizes[chosen].tolist(), index.offsets[chosen].tolist()))
    runs = []
    for run, chunk_number in enumerate(run_chunks.tolist()):
        chunk = index.column_chunks[chunk_number]
        runs.append(ChunkRun(chunk.meta, ranges[bounds[run]:bounds[run + 1]],
                             chunk.dictionary[::-1] if run_needs[run] else None, run_rows[run]))
    reads = {column: ColumnRead(runs[column_runs[i]:column_runs[i + 1]], positions[i], column_only[i])
             for i, column in enumerate(ordered.tolist())}
    return [reads[column] for column in columns]


def _starts(values: np.ndarray) -> np.ndarray:
    """Where each run of equal values of a non-empty array starts."""
    out = np.empty(len(values), bool)
    out[0] = True
    np.not_equal(values[1:], values[:-1], out=out[1:])
    return out


def _one_row_reads(index: PageIndex, row: int, ordered: np.ndarray, columns: Sequence[int]) -> list[ColumnRead]:
    """`column_reads` of one row, as most files of a `get_by` give: a page a column (~20 numpy calls of the
    general case for a handful here)."""
    page = index.keys.searchsorted(ordered << _ROW_BITS | row, side="right") - 1
    positions = (row - (index.keys[page] & _ROW_MASK))[:, None]
    encoded = index.dictionary_encoded[page].tolist()
    reads = {}
    for i, (column, chunk_number, rows, size, offset) in enumerate(zip(
            ordered.tolist(), index.chunks[page].tolist(), index.rows[page].tolist(), index.sizes[page].tolist(),
            index.offsets[page].tolist())):
        chunk = index.column_chunks[chunk_number]
        run = ChunkRun(chunk.meta, [(size, offset)], chunk.dictionary[::-1] if encoded[i] else None, rows)
        reads[column] = ColumnRead([run], positions[i], encoded[i])
    return [reads[column] for column in columns]


def _prefetched(wanted: Sequence[tuple[FilePages, np.ndarray]],
                reads: Sequence[dict[str, ColumnRead]]) -> dict[str, dict[tuple[int, int], bytes]]:
    """path -> (length, offset) -> bytes of every range the read needs, for files on an object store."""
    out = {}
    for (pages, _), file_reads in zip(wanted, reads):
        if pages.storage.local or not file_reads:
            continue
        ranges = {r for read in file_reads.values() for r in read.ranges()}
        with open_read(pages.storage, pages.path) as file:
            ordered = sorted(ranges, key=lambda r: r[1])
            out[pages.path] = dict(zip(ordered, file.read_many(ordered)))
    return out


def _read_kind(wanted: Sequence[tuple[FilePages, np.ndarray]], reads: Sequence[dict[str, ColumnRead]], kind: _Kind,
               files: dict[str, OpenFile], fetched: dict[str, dict[tuple[int, int], bytes]]) -> list[pa.Array]:
    """The wanted rows of each of the kind's (column, file), its pages decoded together. `files`: each file
    opened once for every column (ranged reads are thread-safe): opened per column, the opens and their stats
    were a tenth of a `get_by`.

    Pages that need no dictionary page join the row group before them where the column chunks' metadata is the
    same, so one row group holds the pages of many files and columns: a `by_part` query's mini files held 342
    row groups, 243 so (most of lineitem's columns are dictionary-encoded, and a dictionary page starts a row
    group)."""
    groups: list[list] = []
    owned: list[tuple[str, str, tuple]] = []  # each (file, column)'s own row groups, to name a damaged one
    places: list[np.ndarray | None] = []
    decoded_rows = 0
    for name, i in kind.pieces:
        pages, _ = wanted[i]
        read = reads[i].get(name)
        if read is None:  # no rows wanted from this file
            places.append(None)
            continue
        ranges = read.ranges()
        have = fetched.get(pages.path)
        data = [have[r] for r in ranges] if have is not None else files[pages.path].read_many(ranges)
        places.append(decoded_rows + read.positions)
        at = 0
        for run in read.runs:
            chosen = data[at:at + len(run.pages)]
            at += len(run.pages)
            dictionary = data[at] if run.dictionary else None
            at += dictionary is not None
            owned.append((pages.path, name, (run.meta, dictionary, chosen, run.rows)))
            if dictionary is None and groups and groups[-1][0] == run.meta:
                groups[-1][2].extend(chosen)
                groups[-1][3] += run.rows
            else:
                groups.append([run.meta, dictionary, list(chosen), run.rows])
            decoded_rows += run.rows
    if not groups:
        return [pa.array([], pa.null()) for _ in kind.pieces]
    try:
        decoded = _decode(kind.element, groups, kind.dictionary)
    except (OSError, pa.ArrowException) as e:
        raise _damaged(kind.element, owned, e) from None
    # one take of every file's rows (a take per file and column was a seventh of a `get_by`'s decoding threads)
    taken = _values(decoded.take(pa.array(np.concatenate([p for p in places if p is not None]))), kind.element)
    out, start = [], 0
    for positions in places:
        count = 0 if positions is None else len(positions)
        out.append(taken.slice(start, count))
        start += count
    return out


def _decode(element: bytes, groups: list[tuple], as_dictionary: bool = False) -> pa.Array:
    """The pages decoded. `ParquetFile`, not `pq.read_table`: that imports `pyarrow.dataset` (and pandas) on
    first use, 0.15 s that a `get` in a fresh process would pay.

    Strings whose chosen pages are all dictionary-encoded (`as_dictionary`) decode as a dictionary array,
    indices only: the caller takes its few rows, then `_values` decodes those. A dictionary-encoded page holds
    up to 2,048 rows (`key_pages.MAX_ROWS_PER_PAGE`) for the one or two wanted; lineitem's four such columns
    took 0.83-1.34 ms each decoded whole for one `get_by`, 0.42-0.48 ms so (22 pages in 13 row groups, 45,056
    rows, for 31).

    Decimals stored as fixed-length bytes decode as those bytes (`_fixed_decimal`), and `_values` makes
    decimals of the rows taken: pyarrow's conversion of every decoded row took 1.0-1.6 ms a column for
    lineitem's four, the bytes 0.5-1.0 ms."""
    decimal = _fixed_decimal(element)
    with pq.ParquetFile(pa.BufferReader(mini_parquet(decimal[0] if decimal else element, groups)),
                        page_checksum_verification=True,
                        read_dictionary=[_COPY_NAME.decode()] if as_dictionary else None) as file:
        return file.read(use_threads=False).column(0).combine_chunks()


@functools.lru_cache(maxsize=1024)
def _fixed_decimal(element: bytes) -> tuple[bytes, pa.Decimal128Type] | None:
    """For a decimal column stored as big-endian fixed-length bytes (as pyarrow writes decimals): the schema
    element without its decimal annotation, and the decimal type. None for any other column, and for
    decimals wider than 16 bytes (decimal256)."""
    fields, _ = read_struct(element, 0, "a schema element")
    logical = fields.get(10, {}).get(_DECIMAL)
    if fields.get(1) != _FIXED_LEN_BYTE_ARRAY or not 0 < fields.get(2, 0) <= 16 or (
            fields.get(6) != _DECIMAL and logical is None):
        return None
    scale, precision = (logical[1], logical[2]) if logical else (fields.get(7, 0), fields[8])
    plain = encode_struct([(1, I32, _FIXED_LEN_BYTE_ARRAY), (2, I32, fields[2]), (3, I32, fields.get(3, 0)),
                           (4, BINARY, fields[4])])
    return plain, pa.decimal128(precision, scale)


def _values(array: pa.Array, element: bytes) -> pa.Array:
    """Rows taken from `_decode`'s array as the column's values: a dictionary array decoded, a decimal's
    big-endian two's-complement bytes turned into Arrow's 16-byte little-endian ones, with the sign
    extended."""
    if pa.types.is_dictionary(array.type):
        return array.dictionary_decode()
    decimal = _fixed_decimal(element)
    if decimal is None:
        return array
    width, rows = array.type.byte_width, array.offset + len(array)
    validity, data = array.buffers()
    raw = np.frombuffer(data, np.uint8, count=rows * width).reshape(rows, width)
    out = np.where(raw[:, :1] >= 0x80, np.uint8(0xFF), np.uint8(0)).repeat(16, axis=1)
    out[:, :width] = raw[:, ::-1]
    return pa.Array.from_buffers(decimal[1], len(array), [validity, pa.py_buffer(out)], offset=array.offset)


def _damaged(element: bytes, owned: list[tuple[str, str, tuple]], error: Exception) -> CorruptFileError:
    """The error naming the file whose pages do not decode: each file's pages of each column decoded alone."""
    for path, name in dict.fromkeys((path, name) for path, name, _ in owned):
        try:
            _decode(element, [group for owner, column, group in owned if (owner, column) == (path, name)])
        except (OSError, pa.ArrowException) as e:
            return CorruptFileError(path, f"the pages of column {name!r} do not decode: {e}")
    return CorruptFileError(owned[0][0], f"the pages of columns {sorted({name for _, name, _ in owned})} do not "
                                         f"decode together: {error}")


def _uncompressed_size(page: bytes) -> int:
    """A page's header and uncompressed body size."""
    sizes = leading_ints(page, 3)
    return len(page) if sizes is None else len(page) - sizes[2] + sizes[1]


def column_meta(meta: dict) -> bytes:
    """The fields of a column chunk's ColumnMetaData that a copy of its pages keeps (type, encodings, codec),
    with the path of the copy's column (`_COPY_NAME`), encoded once per file: encoding them for every copy was
    a third of `mini_parquet`'s time."""
    return encode_struct([(1, I32, meta[1]), (2, LIST, (I32, meta[2])), (3, LIST, (BINARY, [_COPY_NAME])),
                          (4, I32, meta[4])])[:-1]  # without the struct's end: `mini_parquet` goes on from 4


# thrift compact field headers: (id delta << 4) | type
_NEXT_I64, _SKIP_I64 = bytes([0x10 | I64]), bytes([0x20 | I64])  # an i64 field 1 or 2 ids after the last
_NEXT_STRUCT, _NEXT_LIST = bytes([0x10 | STRUCT]), bytes([0x10 | LIST])
_ONE_STRUCT = bytes([0x10 | STRUCT])  # a list header: one element, a struct
_END = b"\x00"
_ROOT = encode_struct([(4, BINARY, b"schema"), (5, I32, 1)])  # the schema's root element


def mini_parquet(element: bytes, groups: list[tuple[bytes, bytes | None, list[bytes], int]]) -> bytes:
    """A Parquet file of one column (schema element `element`) whose row groups are the given pages:
    (column metadata from `column_meta`, dictionary page or None, data pages, rows). Each row group's
    structs are joined from field headers and `nonnegative` values: `encode_struct` took two thirds of the
    3.7 ms that a `by_part` query spent here (355 row groups in 19 files; `test_mini_parquet_encodes_...`
    holds it to `encode_struct`'s bytes)."""
    out = bytearray(b"PAR1")
    row_groups = []
    total = 0
    for meta, dictionary, pages, rows in groups:
        start = len(out)
        dictionary_offset = b""
        if dictionary is not None:
            dictionary_offset = _SKIP_I64 + nonnegative(len(out))  # ColumnMetaData 11
            out += dictionary
        data_offset = len(out)
        for page in pages:
            out += page
        stored = nonnegative(len(out) - start)
        uncompressed = sum(_uncompressed_size(page) for page in ([dictionary] if dictionary else []) + pages)
        rows_value = nonnegative(rows)
        # ColumnMetaData after its 4th field: num_values (5), sizes (6, 7), data_page_offset (9), then 11
        column = meta + _NEXT_I64 + rows_value + _NEXT_I64 + nonnegative(uncompressed) + _NEXT_I64 + stored + \
            _SKIP_I64 + nonnegative(data_offset) + dictionary_offset + _END
        chunk = _SKIP_I64 + nonnegative(start) + _NEXT_STRUCT + column + _END  # ColumnChunk: file_offset (2), 3
        # RowGroup: columns (1), total_byte_size (2), num_rows (3)
        row_groups.append(_NEXT_LIST + _ONE_STRUCT + chunk + _NEXT_I64 + stored + _NEXT_I64 + rows_value + _END)
        total += rows
    footer = encode_struct([(1, I32, 1), (2, LIST, (STRUCT, [_ROOT, element])), (3, I64, total),
                            (4, LIST, (STRUCT, row_groups))])
    out += footer + len(footer).to_bytes(4, "little") + b"PAR1"
    return bytes(out)


def read_rows_of_keys(storage: Storage, paths: Sequence[str], keys: Sequence[pa.Array],
                      columns: Sequence[str]) -> list[pa.Table | None]:
    """For each base file and the keys wanted from it: `columns` of the rows that hold them, in file order;
    None for a file without the page layout this needs. The key column comes from the key pages read to find
    the rows, not decoded again (a `by_part` query's 19 files decoded ~31 key pages twice)."""
    held = _held(storage, paths, keys)
    readable = [i for i, plan in enumerate(held) if plan is not None]
    others = [name for name in columns if name != KEY_COLUMN]
    out: list[pa.Table | None] = [None] * len(held)
    for i, table in zip(readable, read_rows([held[i][:2] for i in readable], others)):
        out[i] = pa.table({name: held[i][2] if name == KEY_COLUMN else table[name] for name in columns})
    return out


def _held(storage: Storage, paths: Sequence[str],
          keys: Sequence[pa.Array]) -> list[tuple[FilePages, np.ndarray, pa.Array] | None]:
    """For each base file and the keys wanted from it: the file rows that hold them (ascending) and their keys.
    The keys the file holds are found by probing a key page each (`KeyPages.probe`: a key absent from a file,
    as when a key is looked for in every partition, costs one page read); the pages holding those are then
    decoded to find their rows. None for a file without the page layout this needs."""
    plans: list[tuple[FilePages, np.ndarray, pa.Array] | None] = []
    candidates = []
    for path, wanted in zip(paths, keys):
        pages, index = file_pages(storage, path), key_pages(storage, path)
        if pages is None or index is None:
            plans.append(None)
            continue
        _, holding, _ = index.probe(wanted.to_pylist())  # one key page probed per key, its rows not decoded
        rows = pages.key_rows_of_pages(sorted(holding))
        plans.append((pages, rows, pa.array([], pa.string())))
        if len(rows):
            candidates.append(len(plans) - 1)
    read = read_rows([plans[i][:2] for i in candidates], [KEY_COLUMN])
    for i, table in zip(candidates, read):
        pages, rows, _ = plans[i]
        where = pc.index_in(keys[i], value_set=table[KEY_COLUMN])
        found = where.filter(pc.is_valid(where)).to_numpy(zero_copy_only=False).astype(np.int64)
        held, first = np.unique(rows[found], return_index=True)  # a key asked twice is read once
        plans[i] = (pages, held, table[KEY_COLUMN].take(found[first]))
    return plans
