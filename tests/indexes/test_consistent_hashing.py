"""The consistent-hashing ring: fixed vectors from RFC-42 and the contract, and properties against a bisect model."""
from __future__ import annotations

import bisect

import mmh3
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from indexes.consistent_hashing import (
    DELETE, MAX_HASH, NORMAL, REPLACE, ConsistentHashingAssigner, ResizeLimits, Ring, RingPlan, initial_ring, merge,
    middle, pending_ring, plan_resize, quantile_points, split, under_resize)

MAX = MAX_HASH


@pytest.mark.parametrize("n,values", [
    (1, [MAX]),
    (2, [1073741824, MAX]),
    (3, [715827883, 1431655766, MAX]),
    (4, [536870912, 1073741824, 1610612736, MAX]),
    (8, [268435456 * i for i in range(1, 8)] + [MAX]),
])
def test_initial_ring(n, values):
    ring = initial_ring("p=1", n)
    assert [node.value for node in ring.nodes] == values
    assert ring.seq_no == 0 and all(node.tag == NORMAL for node in ring.nodes)
    assert ring.file_ids == [f"{node.file_id_prefix}-0" for node in ring.nodes]
    assert initial_ring("p=1", n) == ring, "two writers creating one partition agree"
    assert not set(initial_ring("p=2", n).file_ids) & set(ring.file_ids)


@pytest.mark.parametrize("v0,v1,expected", [
    (MAX, 0xF, 1073741831), (1, MAX, 0), (0, MAX, None), (1, MAX - 10, MAX - 4), (9, MAX - 2, 3), (0, MAX - 1, MAX)])
def test_middle_split_of_a_two_node_ring_at_v0(v0, v1, expected):
    assert middle(former=v1, value=v0) == expected


def test_merge_wraps_around_the_ring():
    ring = initial_ring("p", 8)
    nodes = merge(ring, [7, 0, 1])
    assert [(n.value, n.tag) for n in nodes] == [(MAX, DELETE), (268435456, DELETE), (536870912, REPLACE)]
    merged = pending_ring(ring, nodes).resolved("t")
    assert merged.num_buckets == 6 and merged.seq_no == 1 and merged.instant == "t"
    # a hash past the last node (now n6) wraps to the merged node
    assert merged.live[merged.locate(np.array([MAX, 0, 536870912]))[0]].value == 536870912
    with pytest.raises(ValueError, match="adjacent"):
        merge(ring, [1, 3])


def test_quantile_split_of_a_bucket_with_known_hashes():
    hashes = np.arange(1, 101)
    assert quantile_points(0, 1000, hashes, 4) == [25, 50, 75, 1000]
    # a wrapping range (former 2000, value 100): hashes 2001..2100 and 0..99 in ring order
    ring_order = np.r_[np.arange(MAX - 49, MAX + 1), np.arange(0, 50)]
    assert quantile_points(MAX - 50, 100, ring_order, 2) == [MAX, 100]
    # one repeated hash never straddles a cut
    assert quantile_points(0, 1000, np.full(50, 7), 4) == [7, 1000]
    children = split(initial_ring("p", 1), 0, quantile_points(MAX, MAX, hashes, 4))
    assert [c.value for c in children] == [25, 50, 75, MAX] and {c.tag for c in children} == {REPLACE}


def limits(**kw) -> ResizeLimits:
    return ResizeLimits(**{"target": 100, "split_threshold": 2.0, "merge_threshold": 0.2, "min_buckets": 1,
                           "max_buckets": 64, "split_point": "quantile", **kw})


def test_plan_resize_splits_big_and_merges_small_adjacent_buckets():
    ring = initial_ring("p", 6)
    hashes = {0: np.linspace(1, ring.nodes[0].value, 500).astype(np.int64)}
    pending = plan_resize(ring, [500, 10, 10, 100, 5, 5], limits(), lambda i: hashes[i])
    after = pending.resolved("t")
    # node 0 splits into ceil(500/100) = 5; nodes 1-2 merge; 4-5 merge (each < 20, together < 100)
    assert after.num_buckets == 5 + 1 + 1 + 1
    moves = under_resize(ring, pending)
    assert len(moves[ring.file_ids[0]]) == 5
    assert moves[ring.file_ids[1]] == moves[ring.file_ids[2]]
    assert moves[ring.file_ids[4]] == moves[ring.file_ids[5]]
    assert ring.file_ids[3] not in moves
    assert plan_resize(ring, [100] * 6, limits(), lambda i: np.zeros(0)) is None
    # bounds: no growth past max_buckets, no shrink below min_buckets
    assert plan_resize(ring, [500, 100, 100, 100, 100, 100], limits(max_buckets=6), lambda i: hashes[i]) is None
    assert plan_resize(ring, [1] * 6, limits(min_buckets=6), lambda i: np.zeros(0)) is None
    middle_split = plan_resize(ring, [500, 100, 100, 100, 100, 100], limits(split_point="middle"), lambda i: 1 / 0)
    assert middle_split.resolved("t").num_buckets == 7


def bisect_model(values: list[int], h: int) -> int:
    i = bisect.bisect_left(values, h)
    return 0 if i == len(values) else i


hashes_strategy = st.lists(st.integers(0, MAX), min_size=1, max_size=50)


@settings(max_examples=200, deadline=None)
@given(values=st.sets(st.integers(0, MAX), min_size=1, max_size=20), hashes=hashes_strategy)
def test_ring_lookup_equals_bisect(values, hashes):
    values = sorted(values)
    ring = Ring("p", tuple(initial_ring("p", 1).nodes[0].__class__(v, f"n{v}") for v in values))
    assert ring.locate(np.array(hashes)).tolist() == [bisect_model(values, h) for h in hashes]


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 8), rounds=st.lists(st.tuples(st.lists(st.integers(0, 400), min_size=16, max_size=16),
                                                      st.sampled_from(["quantile", "middle"]), hashes_strategy),
                                            min_size=1, max_size=5), probe=hashes_strategy)
def test_any_sequence_of_splits_and_merges_covers_the_ring_once(n, rounds, probe):
    ring = initial_ring("p", n)
    for seq, (sizes, point, hashes) in enumerate(rounds):
        pending = plan_resize(ring, sizes[:ring.num_buckets] + [50] * (ring.num_buckets - len(sizes)),
                              limits(split_point=point), lambda i: np.array(hashes))
        if pending is None:
            continue
        moves = under_resize(ring, pending)
        after = pending.resolved(str(seq))
        # unique values, prefixes never reused, every hash to exactly one node (the bisect model's)
        values = [node.value for node in after.nodes]
        assert values == sorted(set(values)) and all(0 <= v <= MAX for v in values)
        assert len(set(after.file_ids)) == after.num_buckets
        assert after.seq_no == ring.seq_no + 1
        located = after.locate(np.array(probe))
        assert located.tolist() == [bisect_model(values, h) for h in probe]
        # a key of a replaced node lands in one of the nodes that node's keys go to
        before = ring.locate(np.array(probe))
        for h, b, a in zip(probe, before.tolist(), located.tolist()):
            old = ring.file_ids[b]
            assert after.file_ids[a] in moves.get(old, [old]), h
        ring = after


@settings(max_examples=50, deadline=None)
@given(keys=st.lists(st.tuples(st.text(max_size=12), st.sampled_from(["a", "b", "c"])), max_size=60))
def test_the_assigner_maps_each_key_by_its_own_partitions_ring(keys):
    """One searchsorted over every partition's ring equals each key's own ring lookup (wrap included)."""
    wrapped = initial_ring("a", 8)
    wrapped = pending_ring(wrapped, merge(wrapped, [7, 0, 1])).resolved("t")  # its last node is not MAX
    plan = RingPlan(3, {"a": wrapped, "b": initial_ring("b", 5)})  # "c" gets its initial ring
    names, partitions = pa.array([k for k, _ in keys], pa.string()), pa.array([p for _, p in keys], pa.string())
    got = ConsistentHashingAssigner(plan).file_ids(names, partitions).to_pylist()
    hashes = [mmh3.hash(k, signed=False) & MAX for k, _ in keys]
    assert got == [plan.ring(p).file_ids[plan.ring(p).locate(np.array([h]))[0]] for (_, p), h in zip(keys, hashes)]
