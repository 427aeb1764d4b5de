"""Record keys, partition paths and buckets for whole Arrow tables (the batch form of indexes.keys)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metatable.errors import InvalidInputError

from . import murmur3
from .keys import NON_PARTITIONED, record_index_key

NULL_PARTITION = "__null__"
MAX_SEGMENT_BYTES = 255  # a file name's limit on ext4, xfs, btrfs and tmpfs


def _as_text(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    t = column.type
    if pa.types.is_string(t):
        return column
    if pa.types.is_boolean(t):
        return pc.if_else(column, "true", "false")
    if pa.types.is_timestamp(t):
        return pc.strftime(column, format="%Y-%m-%dT%H:%M:%S")
    return pc.cast(column, pa.string())


def _may_be_empty(t: pa.DataType) -> bool:
    """Whether a key column's text may be "": not for numbers, booleans, dates and times, which always print
    something. Checking only for nulls there: the keys of a 1M-row load chunk (two integer columns) took
    120 -> 81 ms."""
    return not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
                or pa.types.is_boolean(t) or pa.types.is_temporal(t))


def record_keys(table: pa.Table, fields: Sequence[str]) -> pa.ChunkedArray:
    """The contract record key of every row: one field -> its text; several -> `f1:v1,f2:v2`.
    A null or empty key value is an error that says how many rows have it and shows one."""
    parts = []
    for i, name in enumerate(fields):
        if name not in table.column_names:
            raise InvalidInputError(f"record key column {name!r} is missing from the data "
                                    f"(columns: {table.column_names})")
        text = _as_text(table[name])
        if text.null_count or (_may_be_empty(table[name].type) and pc.any(pc.equal(text, "")).as_py()):
            bad = pc.or_kleene(pc.is_null(text), pc.equal(text, ""))
            bad_count = pc.sum(pc.cast(pc.fill_null(bad, True), pa.int64())).as_py() or 0
            row = pc.index(pc.fill_null(bad, True), True).as_py()
            raise InvalidInputError(f"record key column {name!r} is null or empty in {bad_count} rows "
                                    f"(first at row {row}); every record needs a key")
        if len(fields) > 1:
            parts += [pa.scalar(("," if i else "") + f"{name}:"), text]
        else:
            parts.append(text)
    if len(fields) == 1:
        return parts[0] if isinstance(parts[0], pa.ChunkedArray) else pa.chunked_array([parts[0]])
    return pc.binary_join_element_wise(*parts, "")


def _escape(text: pa.ChunkedArray) -> pa.ChunkedArray:
    """A value as a path segment: `%`, `/`, `=` and NUL percent-encoded, and the string that names a null
    (`NULL_PARTITION`) with its first character encoded, so that no value shares a null's partition."""
    for char, code in (("%", "%25"), ("/", "%2F"), ("=", "%3D"), ("\0", "%00")):
        text = pc.replace_substring(text, char, code)
    return pc.if_else(pc.equal(text, NULL_PARTITION), "%5F" + NULL_PARTITION[1:], text)


def _check_lengths(name: str, texts: pa.Array) -> None:
    """Every `name=value` segment fits a file name (NAME_MAX of common file systems), so a bad value is refused
    before anything is written under it."""
    lengths = pc.binary_length(pc.cast(texts, pa.binary())).to_numpy(zero_copy_only=False)
    longest = int(lengths.max(initial=0)) + len(name.encode()) + 1
    if longest > MAX_SEGMENT_BYTES:
        value = texts[int(lengths.argmax())].as_py()
        raise InvalidInputError(f"a value of partition column {name!r} is too long for a path: {name}={value[:40]}... "
                                f"is {longest} bytes, and a partition directory name may have at most "
                                f"{MAX_SEGMENT_BYTES}; nothing was written. Partition by a shorter column (or a "
                                "hash or prefix of this one)")


def encoded_partition_paths(table: pa.Table, fields: Sequence[str]) -> pa.DictionaryArray:
    """Hive-style `f1=v1/f2=v2` of every row, dictionary-encoded: the text of each distinct path, and its
    index per row. A write tags 1M-row chunks of a few partitions: per-row path strings cost the SF 1 load
    ~1 s of building, copying and re-encoding them into file groups."""
    if not fields:
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(table.num_rows, np.int32)),
                                             pa.array([NON_PARTITIONED]))
    codes = np.empty(0, np.int64)  # each row's distinct combination of the fields so far (set by the first)
    texts, positions = [], []  # positions[f][c]: the index of field f's value in combination c
    for name in fields:
        if name not in table.column_names:
            raise InvalidInputError(f"partition column {name!r} is missing from the data "
                                    f"(columns: {table.column_names})")
        # the text of each distinct value (null is one), not of each row: 0.1 s for 6M rows against 0.7 s
        column = table[name]
        column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column  # also of no chunks
        encoded = pc.dictionary_encode(column, null_encoding="encode")
        texts.append(pc.fill_null(_escape(_as_text(encoded.dictionary)), NULL_PARTITION))
        _check_lengths(name, texts[-1])
        values = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        size = len(encoded.dictionary)
        if not positions:
            codes, positions = values, [np.arange(size)]
            continue
        # renumbered after each field, so the codes stay below the row count and the product cannot overflow
        distinct, codes = np.unique(codes * size + values, return_inverse=True)
        positions = [p[distinct // size] for p in positions] + [distinct % size]
    parts = []
    for i, (name, text, position) in enumerate(zip(fields, texts, positions)):
        parts += [pa.scalar(("/" if i else "") + f"{name}="), text.take(pa.array(position))]
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), pc.binary_join_element_wise(*parts, ""))


def partition_paths(table: pa.Table, fields: Sequence[str]) -> pa.ChunkedArray:
    """Hive-style `f1=v1/f2=v2` per row; `.` for a non-partitioned table."""
    return pa.chunked_array([decoded(encoded_partition_paths(table, fields))])


def partition_texts(path: str, fields: Sequence[str]) -> dict[str, str | None] | None:
    """The text of each partition column's value in a Hive-style path (the inverse of
    `encoded_partition_paths`; None for a null), or None when the path is not one of these fields'."""
    if path == NON_PARTITIONED:
        return {} if not fields else None
    segments = path.split("/")
    if len(segments) != len(fields):
        return None
    out: dict[str, str | None] = {}
    for name, segment in zip(fields, segments):
        field, sep, text = segment.partition("=")
        if field != name or not sep:
            return None
        out[name] = None if text == NULL_PARTITION else \
            text.replace("%5F", "_", 1 if text.startswith("%5F") else 0).replace("%00", "\0") \
            .replace("%3D", "=").replace("%2F", "/").replace("%25", "%")
    return out


def decoded(strings: pa.Array) -> pa.Array:
    """Plain strings of a maybe dictionary-encoded string array."""
    return strings.dictionary_decode() if pa.types.is_dictionary(strings.type) else strings


def hash32_array(keys: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """hash32 of every key, as int64 (`murmur3.x86_32` over the Arrow buffers: 2M lineitem record keys in
    0.095-0.129 s against 0.296-0.403 s with a call of mmh3 per key)."""
    return murmur3.x86_32(keys).astype(np.int64) & 0x7FFFFFFF


def bucket_ids(keys: pa.ChunkedArray | pa.Array, num_buckets: int) -> np.ndarray:
    return hash32_array(keys) % num_buckets


def pair_codes(first: pa.ChunkedArray | pa.Array, second: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """One integer per row naming its pair of (non-null) strings, for numpy to sort: sorting two string
    columns with Arrow took 7.3 s of a 21.7 s SF 1 load, these codes 0.3 s."""
    left = pc.dictionary_encode(first.combine_chunks() if isinstance(first, pa.ChunkedArray) else first)
    right = pc.dictionary_encode(second.combine_chunks() if isinstance(second, pa.ChunkedArray) else second)
    codes = left.indices.to_numpy().astype(np.int64) * len(right.dictionary) + right.indices.to_numpy()
    # numpy's stable sort is a radix sort for 16-bit integers: 0.05 s for 6M rows against 0.39 s for int64
    return codes.astype(np.uint16) if len(codes) and codes.max() < 1 << 16 else codes


def pair_groups(first: pa.ChunkedArray | pa.Array, second: pa.ChunkedArray | pa.Array) -> list[np.ndarray]:
    """The row indices of each distinct pair, each in input order. No Arrow `group_by`: its first call in
    a process costs ~20 ms (Acero's start), which a `get` in a new process paid on a small table."""
    if len(first) == 0:
        return []
    codes = pair_codes(first, second)
    order = np.argsort(codes, kind="stable")
    ordered = codes[order]
    bounds = [*np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]).tolist(), len(order)]
    return [order[start:end] for start, end in zip(bounds[:-1], bounds[1:])]


def record_index_key_array(partition: str, keys: pa.Array | pa.ChunkedArray, unique: bool) -> pa.Array:
    """`keys.record_index_key` of one partition's record keys."""
    keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    if unique:
        return keys
    return pc.binary_join_element_wise(pa.scalar(record_index_key(partition, "", False)), keys, "")


def record_index_key_arrays(partitions: pa.Array | None, keys: pa.Array, unique: bool) -> pa.Array:
    """`keys.record_index_key` of record keys, each in its partition path (`partitions`, maybe
    dictionary-encoded; None where keys are unique): each distinct path's prefix is hashed once."""
    if unique:
        return keys
    encoded = partitions if pa.types.is_dictionary(partitions.type) else pc.dictionary_encode(partitions)
    prefixes = pa.array([record_index_key(p, "", False) for p in encoded.dictionary.to_pylist()], keys.type)
    return pc.binary_join_element_wise(prefixes.take(encoded.indices), keys, "")
