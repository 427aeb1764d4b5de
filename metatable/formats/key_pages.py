"""Point lookups in a base file's record-key column, reading one Parquet page per key.

Base files are written sorted by record key, with a page index and the key column PLAIN-encoded in
small pages (see `write_options`). The page index gives every key page's [min, max] and byte range,
so checking whether a file holds a key reads only the one page whose range admits it: a few KB
instead of the whole key column. pyarrow does not expose the page index, so the footer, the index
and the page headers are decoded here (`thrift_compact`).

Inside a page, a key is searched for as its PLAIN encoding (4-byte little-endian length, then the
bytes) with `bytes.find`, which is exact when the key is 1-255 bytes without NUL and the file's keys
have no NUL and are shorter than 2^24 bytes (the writer records this as `KEYS_NUL_FREE`): then a
length prefix [m, 0, 0, 0] followed by a non-zero byte can only start at a value boundary, because the
only zero bytes are the top bytes of length prefixes. Any other case decodes the page value by value.
"""
from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import itertools
import os
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from indexes.arrow_buffers import string_buffers

from metatable.config import MIN_PAGE_BYTES
from metatable.errors import CorruptFileError, naming_damage
from metatable.formats.thrift_compact import leading_ints, leading_list_size, page_locations, read_struct
from metatable.storage.base import Storage
from metatable.storage.cache import SizedCache
from metatable.table_config import KEY_COLUMN

R = TypeVar("R")

KEYS_NUL_FREE = b"metatable.keys_nul_free"
WRITE_BATCH_ROWS = 128  # pyarrow cuts pages only between write batches
# Rows of other columns are read page by page (`row_pages`), so their pages are kept short too: a dictionary
# page stops at 64 KB (then PLAIN), a page at 2,048 rows. Measured on 14 SF 1 base files (1.4M rows): 56 ->
# 51 MB, a full read 0.81 -> 0.42 s, 18 rows of each file 0.29 -> 0.13 s (1,024 rows: 0.12 s, but a slower
# page-index parse and full read).
MAX_ROWS_PER_PAGE = 2048
DICTIONARY_PAGE_LIMIT = 64 << 10
DICTIONARY_SAMPLE_ROWS = 256
PAGES_A_READ = 256  # key pages read together by a probe: bounds what a probe holds, keeps requests few
_CODECS = {0: None, 1: "snappy", 2: "gzip", 4: "brotli", 6: "zstd", 7: "lz4_raw"}
_DATA_PAGE, _DATA_PAGE_V2 = 0, 3
_PLAIN, _RLE = 0, 3
_ASCENDING = 1
_OPTIONAL = 1


def write_options(rows: pa.Table, compression: str, key_compression: str, page_size: int) -> dict[str, Any]:
    """`pq.write_table` options for `rows` that make the key column searchable page by page: a page index, small
    pages (cut at write batches, so batches are small too), the key column PLAIN (unique keys gain nothing
    from a dictionary) with its own codec; every page short enough for reading rows by page; and a dictionary
    only where it can pay (`dictionary_columns`)."""
    codecs = {name: compression for name in rows.column_names}
    codecs[KEY_COLUMN] = key_compression
    return {"compression": codecs, "use_dictionary": dictionary_columns(rows),
            "write_page_index": True, "data_page_size": page_size, "write_batch_size": WRITE_BATCH_ROWS,
            "max_rows_per_page": MAX_ROWS_PER_PAGE, "dictionary_pagesize_limit": DICTIONARY_PAGE_LIMIT,
            "write_page_checksum": True}


def dictionary_columns(rows: pa.Table) -> list[str]:
    """The columns to dictionary-encode: not the key, nor a column whose first `DICTIONARY_SAMPLE_ROWS` values
    are all distinct (an id, an amount, a timestamp, free text). The writer builds a dictionary until it
    outgrows `DICTIONARY_PAGE_LIMIT`, which a small file's unique column never does: the workload benchmark's
    compaction wrote 480 files of ~3,100 rows in 1.01-1.19 s with every column tried, 0.58-0.67 s with only
    its two repetitive ones, and the files were 15% smaller; the sample costs ~0.12 ms a file. A column of a
    few thousand values in a large file repeats within the sample (its birthday bound) and keeps its
    dictionary."""
    sample = rows.slice(0, DICTIONARY_SAMPLE_ROWS)
    return [name for name, column in zip(rows.column_names, sample.columns) if name != KEY_COLUMN and (
        len(sample) < 2 or not _flat(column.type) or len(pc.unique(column)) < len(sample))]


def _flat(t: pa.DataType) -> bool:
    return not (pa.types.is_nested(t) or pa.types.is_dictionary(t))


def nul_free_metadata(keys: pa.ChunkedArray | pa.Array) -> dict[bytes, bytes]:
    """The footer entry that allows the fast in-page search (see the module docstring). Read off the
    arrays' offsets and bytes with numpy: Arrow's kernels took 4 ms of an SF 1 file group's 115k keys."""
    chunks = keys.chunks if isinstance(keys, pa.ChunkedArray) else [keys]
    nul_free = True
    for chunk in chunks:
        if len(chunk) == 0:
            continue
        offsets, data = string_buffers(chunk)
        nul_free &= int(np.diff(offsets).max()) < 1 << 24 and not (data[offsets[0]:offsets[-1]] == 0).any()
    return {KEYS_NUL_FREE: b"true" if nul_free else b"false"}


@dataclass(frozen=True)
class KeyPages:
    """Where each page of a file's key column lies and which keys it may hold."""

    storage: Storage
    path: str
    mins: tuple[bytes, ...]  # ascending, like the maxima
    maxs: tuple[bytes, ...]
    offsets: tuple[int, ...]  # byte offset of each page (header included)
    sizes: tuple[int, ...]
    codec: str | None
    optional: bool  # the column has definition levels
    nul_free: bool

    @property
    def page_count(self) -> int:
        return len(self.offsets)

    def candidate_pages(self, key: bytes) -> range:
        """The pages whose [min, max] admits `key`: one, or none, for a sorted file."""
        return range(bisect.bisect_left(self.maxs, key), bisect.bisect_right(self.mins, key))

    @functools.cached_property
    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The pages' minima and maxima as numpy bytes, for searching many keys at once (nul-free files)."""
        return np.array(self.mins, dtype="S"), np.array(self.maxs, dtype="S")

    def _by_page(self, wanted: list[bytes], searchable: bool) -> Iterator[tuple[int, np.ndarray]]:
        """Each candidate page and the indices of the keys it may hold, in page order. Keys that are
        searchable (no NUL: numpy's bytes drop trailing NULs) find their pages in one vectorized search:
        ~2.5 us a key less than a bisect per key, at 300k keys a batch."""
        if searchable:
            mins, maxs = self._bounds
            probes = np.array(wanted, dtype="S") if wanted else np.zeros(0, "S1")
            low = np.searchsorted(maxs, probes, "left")
            counts = np.maximum(np.searchsorted(mins, probes, "right") - low, 0)
            keys = np.repeat(np.arange(len(wanted)), counts)
            pages = np.repeat(low - (np.cumsum(counts) - counts), counts) + np.arange(len(keys))
        else:
            pairs = [(page, i) for i, key in enumerate(wanted) for page in self.candidate_pages(key)]
            pages = np.array([p for p, _ in pairs], dtype=np.int64)
            keys = np.array([i for _, i in pairs], dtype=np.int64)
        order = np.argsort(pages, kind="stable")
        pages, keys = pages[order], keys[order]
        bounds = np.flatnonzero(np.r_[True, pages[1:] != pages[:-1]]) if len(pages) else np.zeros(0, np.int64)
        for start, end in zip(bounds, [*bounds[1:], len(pages)]):
            yield int(pages[start]), keys[start:end]

    def contains(self, keys: Sequence[str]) -> tuple[np.ndarray, int]:
        """Which keys the file holds, and the bytes read to tell."""
        found, _, read = self.probe(keys)
        return found, read

    def probe(self, keys: Sequence[str]) -> tuple[np.ndarray, set[int], int]:
        """Which keys the file holds, the pages that hold them, and the bytes read to tell."""
        wanted = [k.encode() for k in keys]
        searchable = [0 < len(key) < 256 and b"\x00" not in key for key in wanted]
        found = np.zeros(len(wanted), dtype=bool)
        read = 0
        holding: set[int] = set()
        with open_read(self.storage, self.path) as file:
            for page, indices, raw in self._pages(file, self._by_page(wanted, self.nul_free and all(searchable))):
                read += len(raw)
                values, start = self._values(raw)
                decoded: set[bytes] | None = None
                for i in indices.tolist():
                    key = wanted[i]
                    if self.nul_free and searchable[i]:
                        here = _holds(values, start, key)
                    else:
                        if decoded is None:
                            decoded = set(plain_values(values, start, self._value_count(raw), self.path))
                        here = key in decoded
                    if here:
                        found[i] = True
                        holding.add(page)
        return found, holding, read

    def _pages(self, file: OpenFile,
               by_page: Iterator[tuple[int, np.ndarray]]) -> Iterator[tuple[int, np.ndarray, bytes]]:
        """Each candidate page with its bytes, read PAGES_A_READ at a time (one request on an object store,
        where they lie close together)."""
        while chunk := list(itertools.islice(by_page, PAGES_A_READ)):
            raws = file.read_many([(self.sizes[page], self.offsets[page]) for page, _ in chunk])
            for (page, indices), raw in zip(chunk, raws):
                yield page, indices, raw

    def _values(self, raw: bytes) -> tuple[bytes, int]:
        """One data page's PLAIN-encoded values: a buffer and where they start in it."""
        sizes = leading_ints(raw, 4) or leading_ints(raw, 3)  # type, uncompressed and compressed size, crc
        if sizes is None or sizes[0] == _DATA_PAGE_V2:
            return self._values_v2(raw)
        kind, size, stored = sizes[:3]
        start = len(raw) - stored  # a page index entry covers the header and the page's bytes
        if kind != _DATA_PAGE or start <= 0:
            raise CorruptFileError(self.path, f"the key column's page index points at a page of type {kind} "
                                              f"and {stored} bytes in a {len(raw)}-byte entry, not a data page")
        check_crc(sizes[3] if len(sizes) == 4 else None, raw, start, self.path)
        data, values = (_decompress(raw, start, size, self.codec, self.path), 0) if self.codec else (raw, start)
        if self.optional:  # RLE definition levels, prefixed by their byte length
            values += 4 + int.from_bytes(data[values:values + 4], "little")
        return data, values

    def _values_v2(self, raw: bytes) -> tuple[bytes, int]:
        header, start = read_struct(raw, 0, self.path)
        if header.get(1) != _DATA_PAGE_V2 or start + header.get(3, -1) != len(raw):
            raise CorruptFileError(self.path, "the key column's page index points at something else than a data page")
        check_crc(header.get(4), raw, start, self.path)
        v2 = header[8]
        levels = v2.get(5, 0) + v2.get(6, 0)  # never compressed, counted in both sizes
        if self.codec and v2.get(7, True):
            return _decompress(raw, start + levels, header[2] - levels, self.codec, self.path), 0
        return raw, start + levels

    def _value_count(self, raw: bytes) -> int:
        header, _ = read_struct(raw, 0, self.path)
        if header.get(1) == _DATA_PAGE_V2:
            return header[8][1] - header[8].get(2, 0)
        return header[5][1]


def check_crc(crc: int | None, raw: bytes, start: int, path: str) -> None:
    """A page's CRC-32 (over its stored bytes), when the writer recorded one (`write_page_checksum`): a
    flipped bit in a page compressed by LZ4 or not at all would otherwise decode to wrong keys silently."""
    if crc is not None and zlib.crc32(memoryview(raw)[start:]) != crc & 0xFFFFFFFF:
        raise CorruptFileError(path, "a key page fails its checksum")


def _holds(values: bytes, start: int, key: bytes) -> bool:
    """Whether `key` is one of the PLAIN values from `start` (see the module docstring for why a value
    preceded by its length prefix is always a real one). Searching the bare key and then checking the
    prefix measured 2.6x faster than searching prefix and key together."""
    prefix = len(key).to_bytes(4, "little")
    at = values.find(key, start + 4)
    while at >= 0:
        if values[at - 4:at] == prefix:
            return True
        at = values.find(key, at + 1)
    return False


@functools.cache
def _codec(name: str) -> pa.Codec:
    return pa.Codec(name)


def _decompress(raw: bytes, start: int, size: int, codec: str, path: str) -> bytes:
    """Decompress `raw[start:]` into `size` bytes."""
    try:
        return _codec(codec).decompress(memoryview(raw)[start:], size, asbytes=True)
    except (OSError, pa.ArrowException) as e:
        raise CorruptFileError(path, f"cannot decompress a key page: {e}") from e


def plain_values(data: bytes, position: int, count: int, path: str) -> list[bytes]:
    """Decode `count` PLAIN byte arrays from `position`, one by one (the slow path)."""
    values = []
    for _ in range(count):
        length = int.from_bytes(data[position:position + 4], "little")
        position += 4
        if position + length > len(data):
            raise CorruptFileError(path, "a key page ends inside a value")
        values.append(data[position:position + length])
        position += length
    return values


FOOTER_READ_BYTES = 1 << 20  # what a footer's read takes of a file's end on an object store (`parquet_footer`)


@dataclass(frozen=True)
class OpenFile:
    """A Parquet file open for reads at the offsets its footer and page index name, through its storage (a
    local file read from its memory map, `LocalStorage.open_mapped`; an object with ranged GETs). Its size is
    read once: a `get` reads ~18,000 pages, and an `fstat` per read cost 5% of it; on an object store the
    size comes with the footer's bytes."""

    storage: Storage
    path: str
    file: Any  # a pyarrow file, or a local file's map: `read_at`, `size`, `close`
    size: int
    tail: bytes = b""  # the file's last bytes, read with its footer on an object store (`tail_of`)

    def _check(self, length: int, offset: int) -> None:
        """A range from the footer or page index: a damaged one can name a negative or impossible range, which
        is a CorruptFileError, not EINVAL or a huge buffer."""
        if length < 0 or offset < 0 or offset + length > self.size:
            raise CorruptFileError(self.path, f"its footer points at bytes {offset}..{offset + length}, "
                                              "outside the file")

    def read(self, length: int, offset: int) -> bytes:
        """`length` bytes at `offset`."""
        self._check(length, offset)
        return self.file.read_at(length, offset)

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """(length, offset) ranges, read together: on an object store, near ones in one request, the others
        in parallel requests."""
        for length, offset in ranges:
            self._check(length, offset)
        tail_start = self.size - len(self.tail)
        outside = [(length, offset) for length, offset in ranges if offset < tail_start]
        if self.storage.local or len(outside) < 2:
            return [self.file.read_at(length, offset) for length, offset in ranges]
        with naming_damage(self.path):
            read = iter(self.storage.read_ranges(self.path, [(offset, length) for length, offset in outside]))
        return [next(read) if offset < tail_start else self.tail[offset - tail_start:offset - tail_start + length]
                for length, offset in ranges]

    def footer(self) -> bytes:
        """The thrift-encoded footer (FileMetaData)."""
        tail = self.file.read_at(8, max(self.size - 8, 0))
        if self.size < 12 or tail[4:] != b"PAR1":
            raise CorruptFileError(self.path, "not a Parquet file (no PAR1 footer)")
        length = int.from_bytes(tail[:4], "little")
        if length > self.size - 12:
            raise CorruptFileError(self.path, f"footer length {length} exceeds the file ({self.size} bytes): "
                                              "truncated?")
        return self.file.read_at(length, self.size - 8 - length)


@contextlib.contextmanager
def open_parquet(storage: Storage, path: str, size: int | None = None, tail: bytes = b"",
                 mapped: bool = False) -> Iterator[OpenFile]:
    """`path`, open for ranged reads; `size` when known saves a request on an object store, and its last bytes
    read already (`tail`) the requests within them (`open_read` opens a file whose footer was read). `mapped`:
    a local file's memory map, for many reads; a footer's two reads open the file plainly (maps made and
    dropped for the footers of the workload's 480 new bases slowed the full read after its batches: design
    notes, stop 79)."""
    with naming_damage(path):
        file = storage.open_mapped(path) if mapped and storage.local else storage.open_input(path, size, tail)
        size = file.size()
    try:
        with naming_damage(path):
            yield OpenFile(storage, path, file, size, tail)
    finally:
        file.close()


def open_read(storage: Storage, path: str) -> contextlib.AbstractContextManager[OpenFile]:
    """A file whose footer was read (`parquet_footer`, cached): open with its size and tail known, for the
    reads of its pages (mapped, on a file system)."""
    footer = parquet_footer(storage, path)
    return open_parquet(storage, path, footer.size, tail_of(storage, path), mapped=True)


def footer_fields(read: Callable[..., R]) -> Callable[..., R]:
    """For a function reading fields of a decoded footer (its arguments a storage and the file's path): a damaged
    footer decodes to fields of other types or none, and that is a CorruptFileError naming the file."""
    @functools.wraps(read)
    def reading(storage: Storage, path: str, *args: Any) -> R:
        try:
            return read(storage, path, *args)
        except (AttributeError, TypeError, KeyError, IndexError, UnicodeDecodeError, RecursionError) as e:
            raise CorruptFileError(path, f"its footer does not decode as Parquet's ({type(e).__name__}: {e})") from None
    return reading


def cached_per_file(maxsize: int) -> Callable[[Callable[[Storage, str], R]], Callable[[Storage, str], R]]:
    """An LRU cache of what is read from a file, keyed by its storage, path and content version
    (`Storage.content_version`): on a file system (inode, size, mtime), so a file damaged or replaced in place
    is read again; on an object store none, since a name is never written twice there (that costs a request
    per read). `cache_clear` forgets everything."""
    def wrap(read: Callable[[Storage, str], R]) -> Callable[[Storage, str], R]:
        @functools.lru_cache(maxsize=maxsize)
        def cached(storage: Storage, path: str, version: str) -> R:
            return read(storage, path)

        @functools.wraps(read)
        def reading(storage: Storage, path: str) -> R:
            with naming_damage(path):
                version = storage.content_version(path)
            return cached(storage, path, version)

        reading.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        return reading
    return wrap


@dataclass(frozen=True, eq=False)
class ParquetFooter:
    """A base file's footer as read once: its bytes, the file's size, and its fields, decoded when first asked
    (`thrift_compact`: ~1.1 ms an 8-column footer, most of a first read of a small file's rows)."""

    raw: bytes
    size: int
    path: str

    @functools.cached_property
    def fields(self) -> dict:
        return read_struct(self.raw, 0, self.path)[0]

    @functools.cached_property
    def written_here(self) -> bool:
        """Whether this process wrote these footer bytes (`remember_footer`): they are as its writer made
        them, so the checks of a damaged footer have nothing to find."""
        return _WRITTEN.get(self.path) == hashlib.blake2b(self.raw, digest_size=16).digest()

    @functools.cached_property
    def metadata(self) -> pq.FileMetaData:
        """pyarrow's view of the footer, made from its bytes (no request) once: a full read of the workload
        benchmark's 480 base files made it for each read, 8% of the read's samples."""
        return pq.read_metadata(pa.BufferReader(self.raw + len(self.raw).to_bytes(4, "little") + b"PAR1"))

    @functools.cached_property
    def column_names(self) -> tuple[str, ...]:
        """The file's top-level columns as pyarrow reads them (asked of each file a read opens)."""
        return tuple(self.metadata.schema.to_arrow_schema().names)


@cached_per_file(maxsize=512)
def parquet_footer(storage: Storage, path: str) -> ParquetFooter:
    """A base file's footer: `key_pages`, `row_pages.file_pages` and reads of the file all start from it (on
    an object store one ranged request, which gives the size too). 512 of them: a full read of 480 file
    groups found none of its footers in 64 (decoding them again was a sixth of the read); an 8-column file's
    costs ~34 KB (tracemalloc), so 17 MB for all 512.

    On an object store the read takes the file's last `FOOTER_READ_BYTES`, kept for a while (`tail_of`): the
    page index lies just before the footer, and before it the key column's chunk (a base file's last column),
    so the page-index reads of a key probe, and the key column of a file of up to ~100k rows, cost no request
    more (a 1,000-row upsert into 4 base files a process had not read: 12 requests, then 4)."""
    tail = b""
    if not storage.local:
        with naming_damage(path):
            tail, size = storage.read_tail(path, FOOTER_READ_BYTES)
        _TAILS.put((storage, path), tail)
    with open_parquet(storage, path, None if storage.local else size, tail) as file:
        raw = file.footer()
        size = file.size
    return ParquetFooter(raw, size, path)


def remember_footer(path: str, staged: str) -> None:
    """A base file this process writes (`staged`: its local copy, about to become `path`): the digest of its
    footer, for `ParquetFooter.written_here`. The compaction of the workload benchmark's 480 file groups, and
    a full read after it, decoded every footer it had written to check it: ~0.5 s of CPU each."""
    with open(staged, "rb") as file:
        file.seek(-8, os.SEEK_END)
        length = int.from_bytes(file.read(4), "little")
        file.seek(-8 - length, os.SEEK_END)
        _WRITTEN.put(path, hashlib.blake2b(file.read(length), digest_size=16).digest())


_WRITTEN: SizedCache[bytes] = SizedCache(16 << 20, lambda digest: 256)  # ~65k files, a path and digest each


def tail_of(storage: Storage, path: str) -> bytes:
    """A base file's last bytes, read with its footer on an object store (`parquet_footer`), while kept."""
    return _TAILS.get((storage, path)) or b""


_TAILS: SizedCache[bytes] = SizedCache(64 << 20)  # 64 base files' tails; an evicted one is read by ranges


def _key_chunks(footer: dict) -> tuple[dict, list[dict]] | None:
    """The key column's schema leaf and its column chunks, one per row group, from a decoded footer; None
    where the column cannot serve page lookups (absent, no page index, not PLAIN: RLE encodes definition
    levels, an unknown codec)."""
    leaves = [element for element in footer.get(2, [])[1:] if not element.get(5)]
    names = [element.get(4) for element in leaves]
    if KEY_COLUMN.encode() not in names:
        return None
    column = names.index(KEY_COLUMN.encode())
    chunks = [row_group[1][column] for row_group in footer.get(4, [])]
    for chunk in chunks:
        meta = chunk.get(3, {})
        if 4 not in chunk or 6 not in chunk or set(meta.get(2, ())) - {_PLAIN, _RLE} or meta.get(4) not in _CODECS:
            return None
    return leaves[column], chunks


@cached_per_file(maxsize=512)
@footer_fields
def key_page_count(storage: Storage, path: str) -> int | None:
    """How many pages `path`'s key column has (None where `key_pages` would be None for want of a page
    index), from the head of each offset index. Deciding whether to probe must not cost the page-index parse
    that probing needs: that took 44 ms for a 1.1M-row file of 4,447 key pages, longer than reading its
    whole key column (~40 ms), and an SF 10 upsert paid it for all 56 files before reading their keys."""
    found = _key_chunks(parquet_footer(storage, path).fields)
    if found is None:
        return None
    count = 0
    with open_read(storage, path) as file:
        heads = file.read_many([(min(chunk[5], 16), chunk[4]) for chunk in found[1]])
        for head in heads:
            size = leading_list_size(head)
            if size is None:
                raise CorruptFileError(path, "its offset index does not start with the page locations")
            count += size
    return count


@footer_fields
def worth_probing(storage: Storage, path: str, keys: int) -> bool:
    """Whether probing a page per key beats reading the whole key column: at most one key per two pages. Most
    files are ruled out by their footer (`key_pages_at_most`), without the offset indexes `key_page_count`
    reads: a fresh process's batch of the workload benchmark, ~67 keys into each of 480 files of ~3,400 rows,
    read every offset index to learn that."""
    most = key_pages_at_most(parquet_footer(storage, path).fields)
    if most is None or keys > most // 2:
        return False
    pages = key_page_count(storage, path)
    return pages is not None and keys <= pages // 2


def too_many_to_probe(keys: int, rows: int) -> bool:
    """Whether `keys` candidates are too many to probe page by page in a base file of `rows` keys, whatever its
    footer says (`worth_probing`): its pages are cut between write batches, so it has at most
    rows / `WRITE_BATCH_ROWS` + 1 of them. A writer that holds a file's key column asks this first: the workload
    benchmark's first batch after a compaction decoded 480 footers, ~0.5 s, to learn it."""
    return keys > (rows // WRITE_BATCH_ROWS + 1) // 2


def key_pages_at_most(footer: dict) -> int | None:
    """How many pages the key column of a base file can have at most, from its decoded footer alone (None
    where it cannot serve page lookups): a page but a column chunk's last is cut at `write.parquet.page_size`
    bytes, at least `MIN_PAGE_BYTES`, or at `MAX_ROWS_PER_PAGE` keys, each at least 5 bytes PLAIN encoded."""
    found = _key_chunks(footer)
    if found is None:
        return None
    return sum(chunk.get(3, {}).get(6, 0) // min(MIN_PAGE_BYTES, 5 * MAX_ROWS_PER_PAGE) + 1 for chunk in found[1])


@cached_per_file(maxsize=512)
@footer_fields
def key_pages(storage: Storage, path: str) -> KeyPages | None:
    """The page index of `path`'s key column, or None where it cannot serve lookups (no page index, a
    dictionary-encoded or unsorted key column: files written before it existed); then callers read the
    whole column. Cached per file identity (an entry is ~100 bytes per page: ~0.4 MB for a 128 MB file of
    1M rows)."""
    footer = parquet_footer(storage, path).fields
    found = _key_chunks(footer)
    if found is None:
        return None
    leaf, chunks = found
    nul_free = any(kv.get(1) == KEYS_NUL_FREE and kv.get(2) == b"true" for kv in footer.get(5, []))
    mins, maxs, offsets, sizes = [], [], [], []
    with open_read(storage, path) as file:
        indexes = file.read_many([r for chunk in chunks for r in ((chunk[7], chunk[6]), (chunk[5], chunk[4]))])
        for column_raw, offset_raw in zip(indexes[::2], indexes[1::2]):
            column_index, _ = read_struct(column_raw, 0, path)
            page_offsets, page_sizes, _ = page_locations(offset_raw, path)
            if column_index.get(4) != _ASCENDING and len(column_index.get(2, [])) > 1:
                return None
            mins += column_index[2]
            maxs += column_index[3]
            offsets += page_offsets.tolist()
            sizes += page_sizes.tolist()
    if mins != sorted(mins) or maxs != sorted(maxs):
        return None  # several row groups, each sorted, but not the file as a whole
    codec = _CODECS[chunks[-1][3][4]] if chunks else None
    return KeyPages(storage, path, tuple(mins), tuple(maxs), tuple(offsets), tuple(sizes), codec,
                    leaf.get(3) == _OPTIONAL, nul_free)
