"""Finding keys among a snapshot's file slices: for `Table.lookup` and for the bloom index's tagging.

With a computed index (bucket), level 1 is each key's file group; otherwise the three-level lookup of
`indexes.lookup` runs over the base files of each partition's latest slices, with record-key ranges and
bloom filters from the metadata table (a base file that has neither stays a candidate, and the report
counts it). Merge-on-read keys that live only in logs are found through the slices whose logs mention
them. Verification always reads the slice itself: the base's key pages or key column, and its logs' keys
and delete markers.
"""
from __future__ import annotations

import threading
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from indexes.bloom import BloomFilter, BloomFilterSet
from indexes.arrow_keys import record_index_key_array, record_index_key_arrays
from indexes.keys import bloom_filter_key, column_stats_key
from indexes.lookup import CandidateFile, Candidates, Filters, LevelReport, bloom_level, distinct, range_level

from metatable.file_group.file_slice import FileSlice
from metatable.file_group.slice_reader import ProbedKeys, base_keys_present, base_path, key_column, live_mask, log_keys
from metatable.formats.key_pages import key_page_count
from metatable.metadata.table import MetadataTable
from metatable.parallel import thread_map
from metatable.storage.base import Storage
from metatable.storage.paths import TablePaths
from metatable.table_config import KEY_COLUMN, TableConfig

KeyRange = tuple[Any, Any]
BLOOM_CACHE_BYTES = 256 << 20  # bloom filters kept in memory per table object
FILTER_SETS_KEPT = 4  # ... and the last few sets of them (copies), each up to:
FILTER_SET_MAX_BYTES = 64 << 20


@dataclass
class Explain:
    index: str
    levels: dict[str, LevelReport] = field(default_factory=dict)
    log_candidates: int = 0
    base_files_read: int = 0
    base_bytes_read: int = 0

    def add(self, report: LevelReport) -> None:
        mine = self.levels.setdefault(report.level, LevelReport(report.level))
        for name in ("keys_in", "pairs_in", "keys_out", "pairs_out", "files_without_index"):
            setattr(mine, name, getattr(mine, name) + getattr(report, name))

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "levels": [r.as_dict() for r in self.levels.values()],
                "log_candidates": self.log_candidates, "base_files_read": self.base_files_read,
                "base_bytes_read": self.base_bytes_read}


FileRef = tuple[str, str]  # (partition, base file name)
# (keys, partitions) -> per partition, each key's file group there (as the index computes it)
FileIdsOf = Callable[[pa.Array, Sequence[str]], Mapping[str, pa.Array]]


class MetadataIndex:
    """Key ranges and bloom filters of base files, read from the metadata table. Filters are kept by file
    (a file is written once, so its filter never changes), within a memory budget; so are the last few
    filter sets, since a table's lookups keep probing the same files. Each call is told which metadata
    indexes its snapshot has ready (`TimelineView.config`): one dropped since is not read."""

    def __init__(self, metadata: MetadataTable, budget: int = BLOOM_CACHE_BYTES) -> None:
        self.metadata = metadata
        self.budget = budget
        self._blooms: OrderedDict[FileRef, BloomFilter | None] = OrderedDict()
        self._bytes = 0
        self._sets: OrderedDict[tuple[FileRef, ...], Filters] = OrderedDict()

    def ranges(self, files: Sequence[FileRef], ready: Collection[str]) -> dict[FileRef, KeyRange]:
        if "column_stats" not in ready or not files:
            return {}
        keys = {column_stats_key(KEY_COLUMN, p, n): (p, n) for p, n in files}
        stats = self.metadata.get_many("column_stats", list(keys))
        return {keys[k]: (r["min_value"], r["max_value"]) for k, r in stats.items()}

    def filters(self, files: Sequence[FileRef], ready: Collection[str]) -> Filters:
        """The files' bloom filters as one set, and each file's slot in it (-1: no filter)."""
        wanted = tuple(files)
        if "bloom_filter" not in ready:
            return BloomFilterSet.of([None] * len(wanted))
        if wanted in self._sets:
            self._sets.move_to_end(wanted)
            return self._sets[wanted]
        loaded = self._load(wanted)
        made = BloomFilterSet.of([loaded[ref] for ref in wanted])
        if made[0].bits.nbytes <= FILTER_SET_MAX_BYTES:
            self._sets[wanted] = made
            while len(self._sets) > FILTER_SETS_KEPT:
                self._sets.popitem(last=False)
        return made

    def _load(self, files: Sequence[FileRef]) -> dict[FileRef, BloomFilter | None]:
        out = {ref: self._blooms[ref] for ref in files if ref in self._blooms}
        for ref in out:
            self._blooms.move_to_end(ref)
        missing = {bloom_filter_key(p, n): (p, n) for p, n in files if (p, n) not in out}
        if missing:
            records = self.metadata.get_many("bloom_filter", list(missing))
            for key, ref in missing.items():
                bloom = BloomFilter.from_bytes(records[key]["bloom_filter"], ref[1]) if key in records else None
                out[ref] = self._blooms[ref] = bloom
                self._bytes += len(bloom.bits) if bloom else 0
            while self._bytes > self.budget and len(self._blooms) > 1:
                _, dropped = self._blooms.popitem(last=False)
                self._bytes -= len(dropped.bits) if dropped else 0
        return out


class RecordIndex:
    """Where keys live, from the `record_index` metadata partition: one batched multi-get, no data file read.
    Without partition values, a partition-scoped table's keys are looked up in every partition."""

    def __init__(self, metadata: MetadataTable, config: TableConfig) -> None:
        self.metadata = metadata
        self.unique = config.keys_unique_across_partitions

    def locate(self, keys: pa.Array, partitions: pa.Array | None,
               all_partitions: Sequence[str] = ()) -> tuple[pa.Array, pa.Array]:
        """(partition, file id) of every key, null where absent; `partitions`: each key's, or None to search
        `all_partitions` (needed only where keys are prefixed by their partition), the first that has it.
        As columns: one multi-get, and only the distinct entries (a file slice's keys share one) decoded."""
        n = len(keys)
        if self.unique or partitions is not None:
            wanted = record_index_key_arrays(partitions, keys, self.unique)
            owners = np.arange(n)
        else:
            wanted = pa.concat_arrays([record_index_key_array(p, keys, False) for p in all_partitions]) \
                if all_partitions else pa.array([], keys.type)
            owners = np.tile(np.arange(n), len(all_partitions))
        found = self.metadata.get_entries("record_index", pc.unique(wanted)) if len(wanted) else None
        if found is None or not len(found):
            return pa.nulls(n, pa.string()), pa.nulls(n, pa.string())
        at = pc.index_in(wanted, value_set=found.keys.cast(wanted.type))
        hits = np.flatnonzero(pc.is_valid(at).to_numpy(zero_copy_only=False))
        located, first = np.unique(owners[hits], return_index=True)  # the first partition that has the key
        entries = pc.dictionary_encode(found.values.take(at.take(pa.array(hits[first]))))
        kind = self.metadata.kind("record_index")
        records = [kind.decode(raw) for raw in entries.dictionary.to_pylist()]
        slot = np.full(n, -1, dtype=np.int64)
        slot[located] = entries.indices.to_numpy(zero_copy_only=False)
        which = pa.array(slot, mask=slot < 0)
        return tuple(pa.array([r[field] for r in records], pa.string()).take(which)
                     for field in ("partition_path", "file_id"))


@dataclass(frozen=True)
class Search:
    """Keys searched for in some partitions' slices, through levels 1 and 2: level 3's work is left."""

    keys: pa.Array
    partitions: Sequence[str]
    with_base: list[FileSlice]  # the slices with a base file, indexed by the candidates' file indexes
    candidates: Candidates


class SliceLocator:
    """Finds keys among a fixed set of file slices (one snapshot)."""

    def __init__(self, storage: Storage, paths: TablePaths, config: TableConfig,
                 slices: Mapping[tuple[str, str], FileSlice],
                 ranges: Callable[[Sequence[FileRef]], Mapping[FileRef, KeyRange]],
                 filters: Callable[[Sequence[FileRef]], Filters], cache_base_keys: int = 0) -> None:
        self.storage, self.paths, self.config = storage, paths, config
        self.ranges, self.filters = ranges, filters
        self.cache_base_keys = cache_base_keys  # how many base files' key columns to keep (0: read each time)
        self._base_keys: OrderedDict[str, ProbedKeys] = OrderedDict()
        self._keys_probed: Counter[str] = Counter()  # keys verified so far, by base file (when caching)
        # slices are fixed: their logs are read once, their keys (touched, alive after the logs) kept
        self._log_keys: dict[tuple[str, str], tuple[ProbedKeys, ProbedKeys]] = {}
        self._lock = threading.Lock()  # the caches above, and Explain's counts, when files verify in threads
        self.by_partition: dict[str, list[FileSlice]] = defaultdict(list)
        for key in sorted(slices):
            self.by_partition[key[0]].append(slices[key])

    def verify(self, fs: FileSlice, candidates: pa.Array, explain: Explain) -> np.ndarray:
        """Which candidate keys are live in the slice: the base probed page by page (few keys) or through its
        whole key column (kept in memory when caching), then the logs. Safe to call for different slices
        from several threads at once."""
        in_base = self._in_base(base_path(self.paths, fs), candidates, explain) if fs.base else None
        in_logs = None
        if fs.logs:
            touched, alive = self._logs(fs)
            in_logs = touched.contains(candidates), alive.contains(candidates)
        return live_mask(self.storage, self.paths, self.config, fs, candidates, in_base, in_logs)

    def _in_base(self, path: str, candidates: pa.Array, explain: Explain) -> np.ndarray:
        """Which candidates the base file holds. A caching locator reads the whole key column once the keys
        it has verified in the file, over all calls, pass half its key pages: a tagger may see a batch a few
        thousand rows at a time, and probing each call's ~600 keys a file page by page, SF 1's bloom
        tagging in 4,096-row calls took 3.43 s, against 2.77 s so."""
        with self._lock:
            cached = self._base_keys.get(path)
            if self.cache_base_keys:
                self._keys_probed[path] += len(candidates)
            probed = self._keys_probed[path]
        read = None
        if cached is None and self.cache_base_keys and probed > self._page_limit(path):
            column, read = key_column(self.storage, path)
            cached = ProbedKeys(column)
        if cached is not None:
            with self._lock:
                self._base_keys[path] = cached
                self._base_keys.move_to_end(path)
                while len(self._base_keys) > self.cache_base_keys:
                    self._base_keys.popitem(last=False)
            found = cached.contains(candidates)
        else:
            found, read = base_keys_present(self.storage, path, candidates)
        if read is not None:
            with self._lock:
                explain.base_files_read += 1
                explain.base_bytes_read += read
        return found

    def _logs(self, fs: FileSlice) -> tuple[ProbedKeys, ProbedKeys]:
        key = (fs.partition, fs.file_id)
        if key not in self._log_keys:
            touched, alive = log_keys(self.storage, self.paths, self.config, fs)
            self._log_keys[key] = ProbedKeys(touched), ProbedKeys(alive)
        return self._log_keys[key]

    def _page_limit(self, path: str) -> int:
        pages = key_page_count(self.storage, path)
        return pages // 2 if pages is not None else 0

    def _search(self, keys: pa.Array, partitions: Sequence[str], file_ids_of: FileIdsOf | None) -> Search:
        """Levels 1 and 2 for `keys` searched in `partitions` (in order: the first one holding a key wins)."""
        with_base = [fs for p in partitions for fs in self.by_partition.get(p, []) if fs.base]
        refs = [(fs.partition, fs.base.file_name) for fs in with_base]

        def load_filters(indexes: list[int]) -> Filters:
            return self.filters([refs[i] for i in indexes])

        if file_ids_of is not None:
            key_idx, file_idx = self._computed_candidates(keys, with_base, file_ids_of)
            n = len(keys)
            first = LevelReport("1 bucket", n, n * len(partitions), distinct(key_idx, n), len(key_idx))
        else:
            known = self.ranges(refs)
            key_idx, file_idx, first = range_level(keys, [CandidateFile(ref[1], *known.get(ref, (None, None)))
                                                          for ref in refs])
        return Search(keys, partitions, with_base, bloom_level(keys, key_idx, file_idx, first, load_filters))

    def _verify_all(self, jobs: list[tuple[FileSlice, pa.Array]], explain: Explain) -> list[np.ndarray]:
        """Level 3 of every search at once, a file per thread: reading and probing key columns is Arrow
        work that releases the GIL. SF 1's bloom tagging verifies 7 files, one a partition, that were
        verified one after another: tagging 300k keys 1.36-1.45 -> 1.13 s, the in-process upsert
        1.67-1.82 -> 1.47-1.56 s."""
        return thread_map(lambda job: self.verify(*job, explain), jobs)

    @staticmethod
    def _computed_candidates(keys: pa.Array, with_base: list[FileSlice],
                             file_ids_of: FileIdsOf) -> tuple[np.ndarray, np.ndarray]:
        """Each key paired with the file group the index computes for it, in every partition that has it."""
        partitions = list(dict.fromkeys(fs.partition for fs in with_base))
        computed = file_ids_of(keys, partitions) if len(keys) else {}
        key_parts, file_parts = [], []
        for partition in partitions if len(keys) else []:
            mine = [i for i, fs in enumerate(with_base) if fs.partition == partition]
            ids = computed[partition]
            position = pc.fill_null(pc.index_in(ids, value_set=pa.array([with_base[i].file_id for i in mine])), -1)
            position = position.to_numpy(zero_copy_only=False)
            hit = np.flatnonzero(position >= 0)
            key_parts.append(hit)
            file_parts.append(np.array(mine, dtype=np.int64)[position[hit]])
        if not key_parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(key_parts), np.concatenate(file_parts)

    def _find_in_logs(self, search: Search, slot: np.ndarray, slots: list[FileSlice], explain: Explain) -> None:
        """Merge-on-read: keys that only logs know of (inserted after the base, so absent from its index).
        `slot`: each searched key's place in `slots`, -1 while not found; updated in place."""
        for fs in (fs for p in search.partitions for fs in self.by_partition.get(p, []) if fs.logs):
            touched, _ = self._logs(fs)
            mentioned = np.flatnonzero(touched.contains(search.keys) & (slot < 0))
            explain.log_candidates += len(mentioned)
            if len(mentioned):
                alive = mentioned[self.verify(fs, search.keys.take(mentioned), explain)]
                slot[alive] = len(slots)
                slots.append(fs)

    def locate(self, keys: pa.Array, partitions: pa.Array | None, file_ids_of: FileIdsOf | None,
               explain: Explain) -> tuple[pa.Array, pa.Array]:
        """(partition, file id) of every key, null where absent; without `partitions`, search them all (a
        key that several partitions hold is reported in one of them: pass partitions to choose). Keys stay
        Arrow arrays and rows numpy indexes throughout: with Python lists of keys, a third of SF 1's bloom
        tagging of 300k keys went to building lists and dicts, key by key."""
        n = len(keys)
        if partitions is None:
            scopes: dict[str | None, np.ndarray] = {None: np.arange(n)}
        else:  # grouped through Arrow's dictionary: np.unique of 6M Python strings took 5 s
            encoded = pc.dictionary_encode(partitions)
            which = encoded.indices.to_numpy(zero_copy_only=False)
            order = np.argsort(which, kind="stable")
            counts = np.bincount(which, minlength=len(encoded.dictionary))
            scopes = dict(zip(encoded.dictionary.to_pylist(), np.split(order, np.cumsum(counts)[:-1])))
        searches = []
        for scope, wanted in scopes.items():
            if scope is not None and scope not in self.by_partition:
                continue  # a partition without file slices holds none of them
            searched = sorted(self.by_partition) if scope is None else [scope]
            searches.append((wanted, self._search(keys.take(wanted), searched, file_ids_of)))
        answers = iter(self._verify_all([(search.with_base[f], search.keys.take(key_idx))
                                         for _, search in searches for f, key_idx in search.candidates.work],
                                        explain))
        slots: list[FileSlice] = []  # the slices keys were found in, by slot
        out_slot = np.full(n, -1, dtype=np.int64)
        for wanted, search in searches:
            result = search.candidates.verified([next(answers) for _ in search.candidates.work])
            for report in result.levels:
                explain.add(report)
            slot = np.where(result.file_of >= 0, result.file_of + len(slots), -1)
            slots.extend(search.with_base)
            self._find_in_logs(search, slot, slots, explain)
            out_slot[wanted] = slot
        missing = pa.array(out_slot, mask=out_slot < 0)
        return (pa.array([fs.partition for fs in slots], pa.string()).take(missing),
                pa.array([fs.file_id for fs in slots], pa.string()).take(missing))

