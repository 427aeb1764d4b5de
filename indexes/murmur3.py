"""murmur3 (seed 0) of many strings at once, with numpy over the Arrow string buffers: the 32-bit hash that
bucket hashing takes (`keys.hash32`) and the x64 128-bit one of bloom filters, each equal to mmh3's
(property-tested). mmh3 has no batch call, and one call per key from Python was the bulk of tagging:
6M lineitem record keys took 1.4 s of CPU in the SF 1 Spark load's tag stage.

Keys are hashed `CHUNK` at a time, all together: each block index updates the keys long enough to have
it, then the tail (its bytes past the key masked to zero, as murmur3 reads a tail) and the finalization
run on all. Keys longer than `LONG_KEY` bytes are hashed one by one with mmh3: the padding `_Words` needs
is as long as the longest key, and each block is a pass over all the keys. A few keys (at most `FEW`) are
hashed one by one with mmh3 too: the vectorized path costs about 85 us however few keys it hashes (a point
read hashes one or two), mmh3 0.1-0.2 us a key (timed for 1 to 256 lineitem record keys).
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

import mmh3
import numpy as np
import pyarrow as pa

from .arrow_buffers import string_buffers

CHUNK = 1 << 16  # keys hashed at once
LONG_KEY = 256  # bytes; longer keys take the scalar path
FEW = 256  # keys; as few take the scalar path (x86_32's crossover is near 1,000 keys, x64_128's near 500)


def strings(keys: Iterable[str] | pa.Array | pa.ChunkedArray) -> pa.Array:
    """Keys as one `string` array (32-bit offsets, as `_Words` reads them)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    elif not isinstance(keys, pa.Array):
        keys = pa.array(list(keys), pa.string())
    return keys if keys.type == pa.string() else keys.cast(pa.string())


def x86_32(keys: Iterable[str] | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """uint32 murmur3 x86 32 of every key, as `mmh3.hash(key, signed=False)`."""
    return _hashed(strings(keys), _x86_32, lambda key: np.uint32(mmh3.hash(key, signed=False)), np.uint32, ())


def x64_128(keys: Iterable[str] | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """(n, 2) uint64: both halves of murmur3 x64 128 of every key, as `mmh3.hash64(key, signed=False)`."""
    return _hashed(strings(keys), _x64_128, lambda key: np.array(mmh3.hash64(key, signed=False), np.uint64),
                   np.uint64, (2,))


def _hashed(keys: pa.Array, vectorized: Callable[[pa.Array], np.ndarray], scalar: Callable[[str], np.ndarray],
            dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    """Every key's hash, `CHUNK` keys at a time: the short ones together, the long ones one by one."""
    out = np.empty((len(keys), *shape), dtype=dtype)
    if len(keys) <= FEW:
        for i, key in enumerate(keys.to_pylist()):
            out[i] = scalar(key or "")  # a null's bytes are none, as the vectorized path reads them
        return out
    for start in range(0, len(keys), CHUNK):
        part = keys.slice(start, CHUNK)
        offsets, _ = string_buffers(part)
        long = np.flatnonzero(np.diff(offsets) > LONG_KEY)
        if len(long) == 0:
            out[start:start + len(part)] = vectorized(part)
            continue
        short = np.ones(len(part), bool)
        short[long] = False
        out[start + np.flatnonzero(short)] = vectorized(part.filter(pa.array(short)))
        for i in long.tolist():
            out[start + i] = scalar(part[i].as_py())
    return out


class _Words:
    """Little-endian words of the keys' bytes at any byte offset, from aligned reads: a key's j-th word is
    the low part of the aligned word under it shifted down and the high part of the next shifted up (numpy's
    gather of unaligned words was 6x slower than of aligned ones). The bytes are copied once with zero
    padding, so a key's last word never reads past them."""

    def __init__(self, keys: pa.Array, dtype: type) -> None:
        offsets, data = string_buffers(keys)
        self.dtype = dtype
        size = np.dtype(dtype).itemsize
        data = data[offsets[0]:offsets[-1]]  # a sliced array's buffer holds the other keys' bytes too
        starts = offsets[:-1] - offsets[0]
        self.lengths = np.diff(offsets)
        # the longest key's length more: a short key's words are read (and ignored) while a longer one's are
        padding = -len(data) % size + (int(self.lengths.max(initial=0)) // size + 3) * size
        padded = np.concatenate([data, np.zeros(padding, np.uint8)])
        self.aligned = padded.view(np.dtype(dtype).newbyteorder("<"))  # native on every machine we run on
        self.first = starts // size
        self.down = ((starts % size) * 8).astype(dtype)
        self.up = (size * 8 - 1 - self.down).astype(dtype)  # after a shift by one: never by a full word
        self.masks = np.array([(1 << (8 * count)) - 1 for count in range(size + 1)], dtype=dtype)

    def each(self, count: int) -> Iterator[np.ndarray]:
        """Each key's words 0, 1, ... count - 1: one gather a word, the next word's low part kept."""
        low = self.aligned[self.first]
        for word in range(count):
            high = self.aligned[self.first + word + 1]
            yield self._joined(low, high)
            low = high

    def _joined(self, low: np.ndarray, high: np.ndarray) -> np.ndarray:
        return (low >> self.down) | ((high << self.dtype(1)) << self.up)

    def partial(self, word: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Each key's `word`-th word with only its first `count` bytes, the rest zero."""
        index = self.first + word
        return self._joined(self.aligned[index], self.aligned[index + 1]) & self.masks[count]


def _rotl32(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


_C1_32, _C2_32 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)


def _x86_32(keys: pa.Array) -> np.ndarray:
    n = len(keys)
    if n == 0:
        return np.empty(0, dtype=np.uint32)
    words = _Words(keys, np.uint32)
    lengths = words.lengths
    blocks = lengths // 4
    h = np.zeros(n, dtype=np.uint32)
    with np.errstate(over="ignore"):
        everyone = int(blocks.min())  # blocks that every key has need no np.where
        for b, word in enumerate(words.each(int(blocks.max()))):
            k = _rotl32(word * _C1_32, 15) * _C2_32
            updated = _rotl32(h ^ k, 13) * np.uint32(5) + np.uint32(0xE6546B64)
            h = updated if b < everyone else np.where(blocks > b, updated, h)
        tail = words.partial(blocks, lengths & 3)
        h = np.where(lengths & 3 > 0, h ^ (_rotl32(tail * _C1_32, 15) * _C2_32), h)
        h ^= lengths.astype(np.uint32)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        return h ^ (h >> np.uint32(16))


def _rotl64(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix64(k: np.ndarray) -> np.ndarray:
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(0xFF51AFD7ED558CCD)
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(0xC4CEB9FE1A85EC53)
    return k ^ (k >> np.uint64(33))


_C1_64, _C2_64 = np.uint64(0x87C37B91114253D5), np.uint64(0x4CF5AD432745937F)


def _x64_128(keys: pa.Array) -> np.ndarray:
    n = len(keys)
    if n == 0:
        return np.empty((0, 2), dtype=np.uint64)
    words = _Words(keys, np.uint64)
    lengths = words.lengths
    blocks = lengths // 16
    h1 = np.zeros(n, dtype=np.uint64)
    h2 = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        everyone = int(blocks.min())
        pairs = words.each(2 * int(blocks.max()))  # a block is two consecutive words: zip takes them in twos
        for b, (first, second) in enumerate(zip(pairs, pairs)):
            k1 = _rotl64(first * _C1_64, 31) * _C2_64
            n1 = _rotl64(h1 ^ k1, 27)
            n1 = (n1 + h2) * np.uint64(5) + np.uint64(0x52DCE729)
            k2 = _rotl64(second * _C2_64, 33) * _C1_64
            n2 = _rotl64(h2 ^ k2, 31)
            n2 = (n2 + n1) * np.uint64(5) + np.uint64(0x38495AB5)
            h1, h2 = (n1, n2) if b < everyone else (np.where(blocks > b, n1, h1), np.where(blocks > b, n2, h2))
        tail = lengths & 15
        k1 = words.partial(2 * blocks, np.minimum(tail, 8))
        k2 = words.partial(2 * blocks + 1, np.maximum(tail - 8, 0))
        h2 = np.where(tail > 8, h2 ^ (_rotl64(k2 * _C2_64, 33) * _C1_64), h2)
        h1 = np.where(tail > 0, h1 ^ (_rotl64(k1 * _C1_64, 31) * _C2_64), h1)
        length = lengths.astype(np.uint64)
        h1 ^= length
        h2 ^= length
        h1 = h1 + h2
        h2 = h2 + h1
        h1 = _fmix64(h1)
        h2 = _fmix64(h2)
        h1 = h1 + h2
        h2 = h2 + h1
    return np.stack([h1, h2], axis=1)
