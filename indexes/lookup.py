"""The multi-level key lookup (RFC-37): which base file holds each key.

Level 1 prunes by record-key ranges from `column_stats`: with the keys sorted once,
a file's [min, max] covers one contiguous run of them, found by two binary
searches, so candidate (key, file) pairs come out without testing every range
against every key. A file without a range is a candidate for every key.
Level 2 probes the candidates' bloom filters (each key hashed once). Level 3
verifies the survivors against the files' own key columns. Each level reports
the keys and (key, file) pairs it let through.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
from .bloom import BloomFilter, key_hashes


@dataclass(frozen=True)
class CandidateFile:
    """A base file and its record-key range from column_stats (None: no stats, a candidate for every key)."""

    name: str
    min_key: str | None = None
    max_key: str | None = None


@dataclass
class LevelReport:
    level: str
    keys_in: int = 0
    pairs_in: int = 0
    keys_out: int = 0
    pairs_out: int = 0
    files_without_index: int = 0

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class LookupResult:
    file_of: dict[int, int]  # key index -> file index (keys found)
    levels: list[LevelReport] = field(default_factory=list)


def range_candidates(keys: Sequence[str], files: Sequence[CandidateFile]) -> tuple[np.ndarray, np.ndarray, int]:
    """(key indexes, file indexes) of every pair whose range admits the key; plus files without a range."""
    if not len(keys) or not files:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    key_array = np.array(keys, dtype=str)
    order = np.argsort(key_array, kind="stable")
    ordered = key_array[order]
    key_parts, file_parts = [], []
    unranged = 0
    for index, f in enumerate(files):
        if f.min_key is None or f.max_key is None:
            unranged += 1
            run = order
        else:
            lo = np.searchsorted(ordered, f.min_key, side="left")
            hi = np.searchsorted(ordered, f.max_key, side="right")
            run = order[lo:hi]
        key_parts.append(run)
        file_parts.append(np.full(len(run), index, dtype=np.int64))
    return np.concatenate(key_parts), np.concatenate(file_parts), unranged


def bloom_survivors(keys: Sequence[str], key_idx: np.ndarray, file_idx: np.ndarray,
                    blooms: Mapping[int, BloomFilter | None]) -> tuple[np.ndarray, np.ndarray, int]:
    """The candidate pairs whose file's bloom filter might contain the key (no filter: kept)."""
    if not len(key_idx):
        return key_idx, file_idx, 0
    used = np.unique(key_idx)
    hashes = np.zeros((len(keys), 2), dtype=np.uint64)
    hashes[used] = key_hashes([keys[i] for i in used])  # each candidate key hashed once
    keep = np.ones(len(key_idx), dtype=bool)
    unfiltered = 0
    order = np.argsort(file_idx, kind="stable")
    files, starts = np.unique(file_idx[order], return_index=True)
    for index, pairs in zip(files, np.split(order, starts[1:])):
        bloom = blooms.get(int(index))
        if bloom is None:
            unfiltered += 1
            continue
        keep[pairs] = bloom.might_contain(hashes=hashes[key_idx[pairs]])
    return key_idx[keep], file_idx[keep], unfiltered


def lookup(keys: Sequence[str], files: Sequence[CandidateFile],
           load_blooms: Callable[[list[int]], Mapping[int, BloomFilter | None]],
           verify: Callable[[int, np.ndarray], np.ndarray]) -> LookupResult:
    """Locate `keys` among `files`. `load_blooms(file indexes)` fetches the level-1 survivors' filters in
    one batch; `verify(file index, key indexes)` says which of those keys the file really holds."""
    n = len(keys)
    key_idx, file_idx, unranged = range_candidates(keys, files)
    first = LevelReport("1 key ranges", n, n * len(files), len(np.unique(key_idx)), len(key_idx), unranged)
    return filter_and_verify(keys, key_idx, file_idx, first, load_blooms, verify)


def filter_and_verify(keys: Sequence[str], key_idx: np.ndarray, file_idx: np.ndarray, first: LevelReport,
                      load_blooms: Callable[[list[int]], Mapping[int, BloomFilter | None]],
                      verify: Callable[[int, np.ndarray], np.ndarray]) -> LookupResult:
    """Levels 2 and 3 over the candidate (key, file) pairs that level 1 (`first`) let through. A key that
    several files hold is reported in the first of them."""
    blooms = load_blooms(sorted(int(i) for i in np.unique(file_idx)))
    k2, f2, unfiltered = bloom_survivors(keys, key_idx, file_idx, blooms)
    levels = [first, LevelReport("2 bloom filters", len(np.unique(key_idx)), len(key_idx), len(np.unique(k2)),
                                 len(k2), unfiltered)]
    found: dict[int, int] = {}
    for index in np.unique(f2):
        pairs = k2[f2 == index]
        for key_index in pairs[verify(int(index), pairs)]:
            found.setdefault(int(key_index), int(index))
    levels.append(LevelReport("3 file check", len(np.unique(k2)), len(k2), len(found), len(found)))
    return LookupResult(found, levels)
