"""Avro log files: one file per deltacommit per file group.

Name: `.<file_id>_<base_instant>.log.<version>_<write_token>`. The Avro header
carries the block's instant, its kind (records, or a rollback command naming
the instant it undoes) and its record count; a file whose blocks do not add up
to that count is truncated. It also lists each entry's key and value lengths
(`metatable.entry_lengths`), so that a reader finds where every entry starts at
once instead of walking the block's length prefixes one by one; Avro readers
ignore the key, and files without it are walked. Files are published
atomically, so a torn file can only be a leftover of a crash; readers skip
files of instants that never completed and raise CorruptFileError for a
completed instant's unreadable file.
"""
from __future__ import annotations

import base64
import dataclasses
import enum
import io
import os
import re
import zlib
from dataclasses import dataclass
from typing import Any, Iterable

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from avro_schemas import schema

from metatable.errors import CorruptFileError, InvalidInputError, naming_damage
from metatable.storage.base import Storage
from metatable.storage.cache import SizedCache
from metatable.timeline.instant import validate_time

LOG_CACHE_BYTES = 256 << 20  # decoded metadata log blocks a metadata table keeps between snapshots (`LogCache`)
ENTRY_LENGTHS = "metatable.entry_lengths"  # header key: zlib'd uint32 lengths, key and value of each entry, base64
_NAME_RE = re.compile(r"^\.(?P<file_id>.+)_(?P<base>\d{17})\.log\.(?P<version>\d+)_(?P<token>[0-9A-Za-z-]+)$")


class BlockKind(str, enum.Enum):
    RECORDS = "records"
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class LogFile:
    """The name of a log file: which file group and file slice it belongs to, and its order in the slice."""

    file_id: str
    base_instant: str
    version: int
    write_token: str

    def __post_init__(self) -> None:
        validate_time(self.base_instant)
        if self.version < 1:
            raise InvalidInputError(f"log version must be >= 1, got {self.version}")

    @property
    def file_name(self) -> str:
        return f".{self.file_id}_{self.base_instant}.log.{self.version}_{self.write_token}"

    @classmethod
    def parse(cls, file_name: str) -> LogFile:
        m = _NAME_RE.match(file_name)
        if not m:
            raise InvalidInputError(
                f"bad log file name {file_name!r}: expected .<file_id>_<base_instant>.log.<version>_<token>"
            )
        return cls(m["file_id"], m["base"], int(m["version"]), m["token"])

    @property
    def instant(self) -> str:
        """Write tokens are `<instant>-<nonce>`: the instant is known without opening the file."""
        return self.write_token.split("-", 1)[0]

    @staticmethod
    def is_log_name(file_name: str) -> bool:
        return _NAME_RE.match(file_name) is not None


@dataclass(frozen=True)
class Entries:
    """A log block's entries as columns: keys (strings) and encoded values. How the metadata table writes
    blocks, and what a write hands it when it has many records with few distinct values (the record index:
    every key of a file maps to one entry), so nothing loops over them in Python."""

    keys: pa.Array
    values: pa.Array

    @classmethod
    def empty(cls) -> Entries:
        return cls(pa.array([], pa.large_string()), pa.array([], pa.large_binary()))

    @classmethod
    def of(cls, pairs: list[tuple[str, bytes]]) -> Entries:
        return cls(pa.array([k for k, _ in pairs], pa.string()), pa.array([v for _, v in pairs], pa.binary()))

    @classmethod
    def repeated(cls, keys: pa.Array | pa.ChunkedArray, value: bytes) -> Entries:
        keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        return cls(keys, pa.array([value], pa.binary()).take(pa.array(np.zeros(len(keys), np.int32))))

    @classmethod
    def concat(cls, parts: list[Entries], may_repeat: bool = True) -> Entries:
        """All parts; where a key repeats, the later part's value (found by a stable sort; a caller that knows
        no key repeats saves it: measured 60-100 ms for 300k keys)."""
        if not parts:
            return cls(pa.array([], pa.string()), pa.array([], pa.binary()))
        if len(parts) == 1 and not may_repeat:
            return parts[0]
        keys = pa.concat_arrays([p.keys for p in parts])
        values = pa.concat_arrays([p.values for p in parts])
        if not may_repeat:
            return cls(keys, values)
        order = pc.sort_indices(keys).to_numpy()
        keys, values = keys.take(pa.array(order)), values.take(pa.array(order))
        if len(keys) > 1:
            last = np.ones(len(keys), dtype=bool)
            last[:-1] = pc.not_equal(keys.slice(0, len(keys) - 1), keys.slice(1)).to_numpy(zero_copy_only=False)
            keys, values = keys.filter(pa.array(last)), values.filter(pa.array(last))
        return cls(keys, values)

    def __len__(self) -> int:
        return len(self.keys)

    def pairs(self) -> list[tuple[str, bytes]]:
        return list(zip(self.keys.to_pylist(), self.values.to_pylist()))

    def take(self, indices: np.ndarray) -> Entries:
        return Entries(self.keys.take(pa.array(indices)), self.values.take(pa.array(indices)))


@dataclass(frozen=True)
class LogBlock:
    instant: str
    kind: BlockKind
    entries: list[tuple[str, bytes]] | Entries  # (key, encoded record), each key once
    target_instant: str | None = None  # the instant a rollback block undoes


def write_container(storage: Storage, path: str, schema: Any, records: Iterable[dict[str, Any]], count: int,
                    meta: dict[str, str]) -> int:
    """An Avro container file whose header says how many records it holds (a data log: durable from the commit
    that makes it part of the table, `Storage.sync`); published atomically. Returns its size."""
    buf = io.BytesIO()
    fastavro.writer(buf, schema, records, metadata={**meta, "metatable.count": str(count)}, codec="null",
                    sync_interval=1 << 20)
    storage.write_atomic(path, buf.getvalue(), immutable=True, durable=False)
    return buf.tell()


def read_container(storage: Storage, path: str, metadata: bool = False) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Header metadata and every record; a short, unreadable or missing file is a CorruptFileError naming it
    (`metadata`: a metadata table's, which a rebuild restores)."""
    with naming_damage(path, metadata=metadata):
        data = storage.read(path, immutable=True)
    try:
        reader = fastavro.reader(io.BytesIO(data))
        meta = dict(reader.metadata)
        records = list(reader)
        expected = int(meta["metatable.count"])
    except Exception as e:  # fastavro raises assorted types on garbage
        raise CorruptFileError(path, f"unreadable log block ({type(e).__name__}: {e})", metadata=metadata) from None
    if len(records) != expected:
        raise CorruptFileError(path, f"truncated log block: {len(records)} of {expected} records", metadata=metadata)
    return meta, records


def write_log(storage: Storage, path: str, block: LogBlock) -> int:
    """One Avro container, whose size it returns: fastavro writes the header, the data block is laid out here.
    Measured: 4-8x faster than fastavro's record writer for the 10^5-entry blocks a record-index commit writes
    (the entries are already bytes: an entry is its key's and value's lengths and bytes)."""
    meta = {"metatable.instant": block.instant, "metatable.block_kind": block.kind.value,
            "metatable.count": str(len(block.entries))}
    if block.target_instant:
        meta["metatable.target_instant"] = block.target_instant
    data_block = b""
    if block.entries:
        entries = block.entries if isinstance(block.entries, Entries) else Entries.of(block.entries)
        body, lengths = _entries_body(entries)
        meta[ENTRY_LENGTHS] = base64.b64encode(zlib.compress(lengths.astype("<u4").tobytes(), 1)).decode()
        data_block = b"".join((avro_long(len(entries)), avro_long(len(body)), body))
    sync = os.urandom(16)
    buf = io.BytesIO()
    fastavro.writer(buf, schema("log_entry"), [], metadata=meta, codec="null", sync_marker=sync)
    if data_block:
        buf.write(data_block)
        buf.write(sync)
    data = buf.getvalue()
    storage.write_atomic(path, data)
    return len(data)


_SMALL = [bytes([n << 1]) for n in range(64)]  # Avro longs 0..63 are one byte


def avro_long(n: int) -> bytes:
    """Avro's zig-zag variable-length long."""
    if 0 <= n < 64:
        return _SMALL[n]
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _entries_body(entries: Entries) -> tuple[bytes, np.ndarray]:
    """The Avro encoding of the entries laid end to end (each key's and value's length, then its bytes), and
    the lengths in that order: key, value, key, value..."""
    keys = entries.keys.cast(pa.binary())
    key_lengths, value_lengths = _byte_lengths(keys), _byte_lengths(entries.values)
    parts = [_lengths(key_lengths), keys, _lengths(value_lengths), entries.values]
    joined = pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.binary()))
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32, count=len(joined) + 1, offset=4 * joined.offset)
    return (joined.buffers()[2].to_pybytes()[offsets[0]:offsets[-1]],
            np.column_stack([key_lengths, value_lengths]).ravel())


def _byte_lengths(values: pa.Array) -> np.ndarray:
    return pc.binary_length(values).to_numpy(zero_copy_only=False).astype(np.int64)


def _lengths(lengths: np.ndarray) -> pa.Array:
    """Each length as an Avro long (lengths repeat: each distinct one is encoded once, found by counting, not
    sorting: `np.unique` of 12M lengths took 1.6 s of an SF 1 record-index commit)."""
    if not len(lengths):
        return pa.array([], pa.binary())
    distinct = np.flatnonzero(np.bincount(lengths))
    which = np.zeros(int(distinct[-1]) + 1, dtype=np.int32)
    which[distinct] = np.arange(len(distinct), dtype=np.int32)
    return pa.array([avro_long(int(n)) for n in distinct], pa.binary()).take(pa.array(which[lengths]))


def read_log(storage: Storage, path: str) -> LogBlock:
    """A metadata log file, its entries as columns (`Entries`, large string keys and large binary values).
    fastavro's record reader made a dict per entry: 2.8-3.8 s for the 1.5M entries (170 MB) of one
    record-index file group after an SF 1 load; walking the block's bytes here takes 1.5-1.7 s."""
    with naming_damage(path, metadata=True):
        data = storage.read(path)
    try:
        reader = fastavro.block_reader(io.BytesIO(data))
        meta = dict(reader.metadata)
        fields = [(f["name"], f["type"]) for f in reader.writer_schema["fields"]]
        if fields != [("key", "string"), ("value", "bytes")]:
            raise ValueError(f"entries of {fields}, not (key: string, value: bytes)")
        lengths = header_lengths(meta.get(ENTRY_LENGTHS))
        parts = [entries_of_block(block.bytes_.getvalue(), block.num_records, lengths) for block in reader]
        expected = int(meta["metatable.count"])
        kind = BlockKind(meta["metatable.block_kind"])
        instant = meta["metatable.instant"]
    except Exception as e:  # fastavro and the walk raise assorted types on garbage
        raise CorruptFileError(path, f"unreadable log block ({type(e).__name__}: {e})", metadata=True) from None
    entries = Entries.concat(parts, may_repeat=False) if parts else Entries.empty()
    if len(entries) != expected:
        raise CorruptFileError(path, f"truncated log block: {len(entries)} of {expected} records", metadata=True)
    return LogBlock(instant, kind, entries, meta.get("metatable.target_instant"))


class LogCache:
    """Decoded log blocks by path and content version (`Storage.content_version`), within `budget` bytes: a log
    file is never rewritten, and each new snapshot of a metadata table used to read every log of the file groups
    it touches again (on an object store a request each)."""

    def __init__(self, storage: Storage, budget: int = LOG_CACHE_BYTES) -> None:
        self.storage = storage
        self._blocks: SizedCache[LogBlock] = SizedCache(budget, lambda b: b.entries.keys.nbytes +
                                                        b.entries.values.nbytes)

    def read(self, path: str) -> LogBlock:
        with naming_damage(path, metadata=True):
            key = (path, self.storage.content_version(path))
        block = self._blocks.get(key)
        if block is None:
            block = read_log(self.storage, path)
            self._blocks.put(key, block)
        return block

    def has(self, path: str) -> bool:
        """Whether the block at `path` is decoded here already (a read of it reads nothing)."""
        with naming_damage(path, metadata=True):
            return self._blocks.get((path, self.storage.content_version(path))) is not None

    def keep(self, path: str, block: LogBlock) -> None:
        """A block this process just wrote at `path`: the next snapshot (the services after a commit, the next
        write) reads it from here."""
        entries = block.entries if isinstance(block.entries, Entries) else Entries.of(block.entries)
        entries = Entries(entries.keys.cast(pa.large_string()), entries.values.cast(pa.large_binary()))  # as read
        self._blocks.put((path, self.storage.content_version(path)), dataclasses.replace(block, entries=entries))


def header_lengths(text: str | None) -> np.ndarray | None:
    """The entry lengths a header lists (`write_log`), None for a file written before it listed them."""
    if text is None:
        return None
    return np.frombuffer(zlib.decompress(base64.b64decode(text, validate=True)), dtype="<u4").astype(np.int64)


def entries_of_block(body: bytes, count: int, lengths: np.ndarray | None = None) -> Entries:
    """The `count` (key, value) entries of an Avro data block of `log_entry` records: each is its key's
    length (a zig-zag varint), the key, the value's length, the value. Given the lengths the header lists,
    every entry's place is computed at once and its length prefixes checked against the body; without
    them the prefixes are read one by one (the walk: 1.1 s for the 1.5M entries of one record-index file
    group of an SF 1 load, against 0.14 s computed and checked). The keys and values are then gathered with
    numpy. Raises on a body that is not exactly that."""
    if lengths is not None:
        if len(lengths) != 2 * count:
            raise ValueError(f"the header lists {len(lengths) // 2} entries, the block holds {count}")
        starts = _checked_starts(np.frombuffer(body, dtype=np.uint8), lengths)
        return _gathered_entries(body, starts, lengths)
    starts = [0] * (2 * count)
    varints = [0] * (2 * count)  # zig-zag encoded lengths: even, else the body is not entries
    pos = 0
    for i in range(2 * count):
        n = body[pos]
        pos += 1
        if n & 0x80:
            n &= 0x7F
            shift = 7
            while True:
                byte = body[pos]
                pos += 1
                n |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
        starts[i] = pos
        varints[i] = n
        pos += n >> 1
    lengths = np.array(varints, dtype=np.int64)
    if (lengths & 1).any():
        raise ValueError("a negative length")
    if pos != len(body):
        raise ValueError(f"{len(body) - pos} bytes after the last of {count} entries")
    lengths >>= 1
    return _gathered_entries(body, np.array(starts, dtype=np.int64), lengths)


def _gathered_entries(body: bytes, starts: np.ndarray, lengths: np.ndarray) -> Entries:
    data = np.frombuffer(body, dtype=np.uint8)
    keys = _gathered(data, starts[0::2], lengths[0::2]).cast(pa.large_string())  # validates UTF-8
    return Entries(keys, _gathered(data, starts[1::2], lengths[1::2]))


def _checked_starts(data: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Where each key and value starts, given every length: each is preceded by its length as a zig-zag
    varint of 1-5 bytes (lengths are below 2^31). The body must hold exactly those varints, byte for byte,
    and those bytes: then the walk would have read the same entries."""
    zigzag = lengths << 1
    sizes = 1 + sum((zigzag >= 1 << (7 * k)).astype(np.int64) for k in range(1, 5))
    ends = np.cumsum(sizes + lengths)
    prefixes = ends - sizes - lengths
    covered = int(ends[-1]) if len(ends) else 0
    if covered != len(data):
        raise ValueError(f"the header's lengths cover {covered} of {len(data)} body bytes")
    for k in range(5):
        wide = np.flatnonzero(sizes > k)
        if not len(wide):
            break
        expected = ((zigzag[wide] >> (7 * k)) & 0x7F) | np.where(sizes[wide] > k + 1, 0x80, 0)
        if not np.array_equal(data[prefixes[wide] + k], expected):
            raise ValueError("the body's length prefixes differ from the lengths the header lists")
    return prefixes + sizes


def _gathered(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.LargeBinaryArray:
    """The byte ranges [start, start + length) of `data` as a binary array, gathered by Arrow: each range is
    described as a binary view (its length, then its bytes inline up to 12, else a 4-byte prefix and its
    offset), and the cast copies them. 0.25 s for the keys and values of 1.5M entries; a mask over `data`
    took 1.0 s, an index per byte 4 s."""
    n = len(starts)
    if len(data) >= 1 << 31:  # a view's offset is 32-bit
        raise ValueError(f"a log block of {len(data)} bytes, more than 2 GiB")
    views = np.zeros((n, 16), dtype=np.uint8)
    views[:, 0:4] = lengths.astype("<i4").view(np.uint8).reshape(n, 4)
    if n and len(data):
        head = data[np.minimum(starts[:, None] + np.arange(12), len(data) - 1)]
        head[np.arange(12)[None, :] >= lengths[:, None]] = 0
        views[:, 4:16] = head
    long = lengths > 12
    views[long, 8:12] = 0  # buffer 0
    views[long, 12:16] = starts[long].astype("<i4").view(np.uint8).reshape(-1, 4)
    return pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(views), pa.py_buffer(data)]) \
        .cast(pa.large_binary())
