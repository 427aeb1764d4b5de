import numpy as np
import pyarrow as pa
from hypothesis import given, strategies as st

from indexes.bloom import BloomFilter, BloomFilterSet
from indexes.lookup import CandidateFile, Candidates, LevelReport, lookup, range_candidates

from metatable.file_group.slice_reader import members

FILES = [CandidateFile("f1"), CandidateFile("f2", "000", "000"), CandidateFile("f3", "001", "003"),
         CandidateFile("f4", "002", "007"), CandidateFile("f5", "009", "010")]


def found(result) -> dict[int, int]:
    """key index -> file index of the keys a lookup found."""
    return {k: int(f) for k, f in enumerate(result.file_of) if f >= 0}


def test_range_pruning_example():
    keys = ["002", "003", "004", "005"]
    k, f, unranged = range_candidates(pa.array(keys), FILES)
    got = {key: set() for key in keys}
    for ki, fi in zip(k, f):
        got[keys[ki]].add(FILES[fi].name)
    assert got == {"002": {"f1", "f3", "f4"}, "003": {"f1", "f3", "f4"}, "004": {"f1", "f4"}, "005": {"f1", "f4"}}
    assert unranged == 1


@given(st.lists(st.text(max_size=4), max_size=30),
       st.lists(st.one_of(st.none(), st.tuples(st.text(max_size=4), st.text(max_size=4))), max_size=6))
def test_range_candidates_are_every_pair_a_range_admits(keys, ranges):
    """Level 1 against the plain definition: (key, file) is a candidate iff the file has no range or its
    [min, max] holds the key, in Python's string order (which is UTF-8 byte order, as Arrow sorts)."""
    files = [CandidateFile(f"f{i}", *(sorted(r) if r else (None, None))) for i, r in enumerate(ranges)]
    k, f, unranged = range_candidates(pa.array(keys, pa.string()), files)
    assert sorted(zip(k.tolist(), f.tolist())) == sorted(
        (ki, fi) for ki, key in enumerate(keys) for fi, file in enumerate(files)
        if file.min_key is None or file.min_key <= key <= file.max_key)
    assert unranged == (sum(r is None for r in ranges) if keys else 0)


@given(st.lists(st.lists(st.integers(0, 200), min_size=1, max_size=30), min_size=1, max_size=6),
       st.lists(st.integers(0, 250), min_size=1, max_size=40), st.booleans())
def test_lookup_equals_ground_truth(contents, probes, with_blooms):
    """Files hold disjoint keys; a lookup finds exactly the file that holds each key."""
    owner, files, data = {}, [], {}
    for i, ints in enumerate(contents):
        keys = sorted({f"{x:04d}" for x in ints} - set(owner))
        if not keys:
            continue
        name = f"file{i}"
        owner.update({k: name for k in keys})
        data[name] = pa.array(keys)
        files.append(CandidateFile(name, keys[0], keys[-1]))
    blooms = {i: BloomFilter.build(data[f.name].to_pylist(), 0.01) if with_blooms else None
              for i, f in enumerate(files)}
    probe_keys = [f"{x:04d}" for x in probes]
    result = lookup(pa.array(probe_keys, pa.string()), files,
                    lambda wanted: BloomFilterSet.of([blooms[i] for i in wanted]), verifier(files, data, probe_keys))
    assert {probe_keys[k]: files[f].name for k, f in found(result).items()} == \
        {k: owner[k] for k in probe_keys if k in owner}
    levels = result.levels
    assert levels[0].pairs_out >= levels[1].pairs_out >= levels[2].pairs_out


def verifier(files, data, keys):
    def verify(file_index, key_indexes):
        return members(pa.array([keys[i] for i in key_indexes], pa.string()), data[files[file_index].name])
    return verify


def test_a_lying_bloom_filter_never_makes_lookup_return_an_absent_key():
    # a filter that claims everything (all bits set) still cannot put an absent key in the result
    everything = BloomFilter(64, 3, 1, b"\xff" * 8)
    files = [CandidateFile("a", "000", "999")]
    keys = ["001", "500"]
    result = lookup(pa.array(keys), files, lambda wanted: BloomFilterSet.of([everything]),
                    verifier(files, {"a": pa.array(["001"])}, keys))
    assert found(result) == {0: 0}
    assert result.levels[1].keys_out == 2 and result.levels[2].keys_out == 1


def test_filters_are_loaded_a_batch_of_files_at_a_time(monkeypatch):
    import indexes.lookup as lookup_module

    monkeypatch.setattr(lookup_module, "FILTER_BATCH_FILES", 2)
    data = {f"f{i}": pa.array([f"{i}{j:03d}" for j in range(50)]) for i in range(5)}
    files = [CandidateFile(name, keys[0].as_py(), keys[-1].as_py()) for name, keys in data.items()]
    blooms = [BloomFilter.build(keys.to_pylist(), 0.01) for keys in data.values()]
    requested = []

    def load(wanted):
        requested.append(list(wanted))
        return BloomFilterSet.of([blooms[i] for i in wanted])

    probe = ["0007", "2049", "4000", "9999", "30205"]  # the last: in f3's range, not in f3
    result = lookup(pa.array(probe), files, load, verifier(files, data, probe))
    assert {probe[k]: files[f].name for k, f in found(result).items()} == {"0007": "f0", "2049": "f2", "4000": "f4"}
    assert max(len(r) for r in requested) <= 2 and sorted(sum(requested, [])) == [0, 2, 3, 4]


def test_a_key_that_several_files_hold_is_reported_in_the_first():
    candidates = Candidates(4, [(0, np.array([0, 1])), (2, np.array([1, 2])), (3, np.array([2, 3]))],
                            [LevelReport("2 bloom filters", keys_out=4)])
    result = candidates.verified([np.array([True, True]), np.array([True, True]), np.array([False, False])])
    assert result.file_of.tolist() == [0, 0, 2, -1]
    assert (result.levels[-1].keys_in, result.levels[-1].pairs_in, result.levels[-1].keys_out) == (4, 6, 3)
