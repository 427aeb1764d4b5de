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
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from .bloom import BloomFilterSet, key_hashes


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
    file_of: np.ndarray  # each key's file index, -1 where no file holds it
    levels: list[LevelReport] = field(default_factory=list)


def range_candidates(keys: pa.Array, files: Sequence[CandidateFile]) -> tuple[np.ndarray, np.ndarray, int]:
    """(key indexes, file indexes) of every pair whose range admits the key; plus files without a range."""
    if not len(keys) or not files:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    order = pc.sort_indices(keys).to_numpy()  # Arrow sorts strings ~5x faster
    ordered = keys.take(order).to_numpy(zero_copy_only=False)  # str objects: searchsorted compares as bisect
    key_parts, file_parts = [], []
    unranged = 0
    for index, f in enumerate(files):
        if f.min_key is None or f.max_key is None:
            unranged += 1
            run = order
        else:
            run = order[np.searchsorted(ordered, f.min_key, "left"):np.searchsorted(ordered, f.max_key, "right")]
        key_parts.append(run)
        file_parts.append(np.full(len(run), index, dtype=np.int64))
    return np.concatenate(key_parts), np.concatenate(file_parts), unranged


def distinct(indexes: np.ndarray, size: int) -> int:
    """How many different values in `indexes` (all in [0, size)): a count, not a sort."""
    return int(np.count_nonzero(np.bincount(indexes, minlength=size))) if len(indexes) else 0


def by_file(file_idx: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(file index, positions of its pairs), file by file (a stable sort: pairs usually come grouped)."""
    if not len(file_idx):
        return
    order = np.argsort(file_idx, kind="stable")
    ordered = file_idx[order]
    for part in np.split(order, np.flatnonzero(ordered[1:] != ordered[:-1]) + 1):
        yield int(file_idx[part[0]]), part


Filters = tuple[BloomFilterSet, np.ndarray]  # filters, and the slot of each requested file in them (-1: none)
LoadFilters = Callable[[list[int]], Filters]
FILTER_BATCH_FILES = 128


def bloom_survivors(keys: pa.Array, key_idx: np.ndarray, file_idx: np.ndarray,
                    load_filters: LoadFilters) -> tuple[np.ndarray, np.ndarray, int]:
    """The candidate pairs whose file's bloom filter might contain the key (no filter: kept), and how
    many files had no filter. Filters are loaded `FILTER_BATCH_FILES` files at a time, which bounds
    memory whatever the table's size (a 1M-key file's filter is ~1.8 MB)."""
    if not len(key_idx):
        return key_idx, file_idx, 0
    used = np.flatnonzero(np.bincount(key_idx, minlength=len(keys)))
    hashes = np.zeros((len(keys), 2), dtype=np.uint64)
    hashes[used] = key_hashes(keys.take(used))  # each candidate key hashed once
    files = np.unique(file_idx)
    keep = np.ones(len(key_idx), dtype=bool)
    unfiltered = 0
    for batch in np.array_split(files, -(-len(files) // FILTER_BATCH_FILES)):
        filter_set, slots = load_filters(batch.tolist())
        unfiltered += int(np.count_nonzero(slots < 0))
        slot_of_file = np.full(int(files[-1]) + 1, -1, dtype=np.int64)
        slot_of_file[batch] = slots
        pair_slot = slot_of_file[file_idx]
        probed = pair_slot >= 0
        if probed.any():
            keep[probed] = filter_set.might_contain(hashes[key_idx[probed]], pair_slot[probed])
    return key_idx[keep], file_idx[keep], unfiltered


@dataclass(frozen=True)
class Candidates:
    """What levels 1 and 2 let through: the (key, file) pairs left, grouped by file as level 3's work, and
    the reports of both levels. Level 3 is the caller's: each file's check is independent, so a caller may
    run them in threads, or gather the work of several lookups and run it all at once."""

    key_count: int  # how many keys were searched
    work: list[tuple[int, np.ndarray]]  # (file index, the key indexes to verify in it), by file index
    levels: list[LevelReport]

    def verified(self, answers: Iterable[np.ndarray]) -> LookupResult:
        """Level 3 from the answers, one mask per entry of `work` (in order) of which of its keys the file
        holds. A key that several files hold is reported in the first of them."""
        file_of = np.full(self.key_count, -1, dtype=np.int64)
        for (index, candidates), held in reversed(list(zip(self.work, answers, strict=True))):
            file_of[candidates[held]] = index  # in reverse: the first file wins
        pairs = sum(len(candidates) for _, candidates in self.work)
        found = int(np.count_nonzero(file_of >= 0))
        return LookupResult(file_of, [*self.levels, LevelReport("3 file check", self.levels[-1].keys_out, pairs,
                                                                found, found)])


def range_level(keys: pa.Array, files: Sequence[CandidateFile]) -> tuple[np.ndarray, np.ndarray, LevelReport]:
    """Level 1 by key ranges: the candidate (key indexes, file indexes), and its report."""
    n = len(keys)
    key_idx, file_idx, unranged = range_candidates(keys, files)
    return key_idx, file_idx, LevelReport("1 key ranges", n, n * len(files), distinct(key_idx, n), len(key_idx),
                                          unranged)


def bloom_level(keys: pa.Array, key_idx: np.ndarray, file_idx: np.ndarray, first: LevelReport,
                load_filters: LoadFilters) -> Candidates:
    """Level 2 over the candidate pairs that level 1 (`first`) let through."""
    k2, f2, unfiltered = bloom_survivors(keys, key_idx, file_idx, load_filters)
    second = LevelReport("2 bloom filters", first.keys_out, first.pairs_out, distinct(k2, len(keys)), len(k2),
                         unfiltered)
    return Candidates(len(keys), [(index, k2[pairs]) for index, pairs in by_file(f2)], [first, second])


def lookup(keys: pa.Array, files: Sequence[CandidateFile],
           load_filters: LoadFilters, verify: Callable[[int, np.ndarray], np.ndarray]) -> LookupResult:
    """Locate `keys` among `files`. `load_filters(file indexes)` fetches level-1 survivors' bloom filters,
    many files at a time; `verify(file index, key indexes)` says which of those keys the file holds."""
    candidates = bloom_level(keys, *range_level(keys, files), load_filters)
    return candidates.verified(verify(index, key_indexes) for index, key_indexes in candidates.work)
