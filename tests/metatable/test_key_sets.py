"""Key sets used for membership (`SortedKeys`, `ProbedKeys`, `fixed_width`) against Python sets."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from metatable.file_group.slice_reader import ProbedKeys, SortedKeys, fixed_width

texts = st.text(alphabet=st.sampled_from("ab:,0é€\U0001f600\x00"), max_size=6)


def test_fixed_width_pads_with_nul_and_keeps_utf8_bytes():
    assert fixed_width(pa.array(["ab", "", "é"])).tolist() == [b"ab", b"", "é".encode()]
    assert fixed_width(pa.array(["l_orderkey:1", "x"])).dtype.itemsize == 12
    assert fixed_width(pa.chunked_array([["b"], ["a", "ccc"]])).tolist() == [b"b", b"a", b"ccc"]
    assert fixed_width(pa.array(["zz", "y", "xxx"]).slice(1)).tolist() == [b"y", b"xxx"]
    assert fixed_width(pa.array(["zz", "é", "xé"]).slice(1)).tolist() == ["é".encode(), "xé".encode()]
    assert len(fixed_width(pa.array([], pa.string()))) == 0


def test_sorted_keys_fixed_vectors():
    keys = SortedKeys(pa.array(["k:3", "k:1", "k:10", "k:2"]))  # not sorted: sorted on construction
    assert keys.contains(pa.array(["k:1", "k:10", "k:4", "", "k:100", "k", "k:1\0"])).tolist() == \
        [True, True, False, False, False, False, False]
    with_nul = SortedKeys(pa.array(["a\0", "b"]))
    assert with_nul.contains(pa.array(["a", "a\0", "b\0", "b"])).tolist() == [False, True, False, True]


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(texts, max_size=40), candidates=st.lists(texts, max_size=40), presorted=st.booleans(),
       offset=st.integers(0, 3))
def test_key_sets_equal_a_python_set(keys, candidates, presorted, offset):
    if presorted:
        keys = sorted(keys, key=str.encode)
    column = pa.array(["pad"] * offset + keys, pa.string()).slice(offset)
    probe = pa.array(candidates, pa.string())
    expected = [c in set(keys) for c in candidates]
    assert SortedKeys(column).contains(probe).tolist() == expected
    probed = ProbedKeys(column)
    for _ in range(ProbedKeys.SORT_AFTER + 2):  # scanned, then sorted
        assert probed.contains(probe).tolist() == expected
    plain = [k for k in keys if "\0" not in k]  # numpy's bytes drop trailing NULs: SortedKeys scans those
    assert fixed_width(pa.array(plain, pa.string())).tolist() == [k.encode() for k in plain]
    assert sorted(fixed_width(pa.array(plain, pa.string())).tolist()) == sorted(k.encode() for k in plain)
