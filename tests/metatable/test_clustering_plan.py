"""Clustering plans against fixed vectors, and the grouping rules as properties."""
from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from metatable.formats.clustering_plan import Candidate, ClusteringPlan, Limits, SliceRef, plan_groups


def candidates(sizes, partition="p", ranges=None, instants=None):
    return {partition: [Candidate(SliceRef(f"f{i}", (f"f{i}.parquet",), size), size,
                                  ranges[i] if ranges else None, instants[i] if instants else "")
                        for i, size in enumerate(sizes)]}


def shape(groups):
    return [([s.bytes for s in g.slices], g.num_output_groups) for g in groups]


def test_the_issue_vector():
    limits = Limits(small_file_limit=500, max_bytes_per_group=2000, max_groups=30, target_file_size=1000)
    groups = plan_groups(candidates([200, 200, 300, 300, 400, 400, 400, 400]), limits)
    assert shape(groups) == [([400, 400, 400, 400, 300], 2), ([300, 200, 200], 1)]


def test_max_groups_caps_the_plan():
    limits = Limits(small_file_limit=500, max_bytes_per_group=100, max_groups=2, target_file_size=1000)
    assert shape(plan_groups(candidates([100, 100, 100, 100]), limits)) == [([100], 1), ([100], 1)]


def test_a_lone_slice_is_clustered_only_when_sorting():
    limits = Limits(small_file_limit=500, max_bytes_per_group=2000, max_groups=30, target_file_size=1000)
    assert shape(plan_groups(candidates([300]), limits, sort_columns=("c",))) == [([300], 1)]
    assert plan_groups(candidates([300]), limits) == []


def test_large_slices_are_not_eligible():
    limits = Limits(small_file_limit=500, max_bytes_per_group=2000, max_groups=30, target_file_size=1000)
    assert shape(plan_groups(candidates([600, 700, 100, 200]), limits)) == [([200, 100], 1)]


def test_key_range_groups_only_overlapping_slices():
    limits = Limits(small_file_limit=500, max_bytes_per_group=2000, max_groups=30, target_file_size=1000)
    ranges = [("a", "c"), ("b", "d"), ("x", "z"), ("m", "n"), ("m", "o")]
    groups = plan_groups(candidates([100, 100, 100, 100, 100], ranges=ranges), limits, strategy="key_range")
    assert sorted(sorted(s.file_id for s in g.slices) for g in groups) == [["f0", "f1"], ["f3", "f4"]]


def test_recent_takes_the_most_recently_written_partitions():
    limits = Limits(small_file_limit=500, max_bytes_per_group=2000, max_groups=30, target_file_size=1000)
    parts = {**candidates([100, 100], "old", instants=["1", "2"]), **candidates([100, 100], "new", instants=["5", "3"]),
             **candidates([100, 100], "mid", instants=["4", "1"])}
    groups = plan_groups(parts, limits, strategy="recent", recent_partitions=2)
    assert sorted(g.partition for g in groups) == ["mid", "new"]


def test_the_plan_round_trips_through_its_avro_record():
    limits = Limits(small_file_limit=500, max_bytes_per_group=2000, max_groups=30, target_file_size=1000)
    plan = ClusteringPlan("size", tuple(plan_groups(candidates([200, 300, 400]), limits)), ("a", "b"))
    assert ClusteringPlan.from_record(plan.to_record()) == plan
    assert plan.file_groups == ["p/f0", "p/f1", "p/f2"]


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 1000), max_size=30), limit=st.integers(1, 1200), max_bytes=st.integers(1, 3000),
       max_groups=st.integers(1, 10), target=st.integers(1, 1500), sort=st.booleans())
def test_grouping_rules_hold(sizes, limit, max_bytes, max_groups, target, sort):
    limits = Limits(limit, max_bytes, max_groups, target)
    groups = plan_groups(candidates(sizes), limits, sort_columns=("c",) if sort else ())
    taken = [s for g in groups for s in g.slices]
    assert len({s.file_id for s in taken}) == len(taken), "a slice is in one group at most"
    assert all(s.bytes < limit for s in taken), "only small slices"
    assert len(groups) <= max_groups
    for g in groups:
        assert g.num_output_groups == max(1, math.ceil(g.bytes / target))
        assert g.bytes <= max_bytes or len(g.slices) == 1, "a group passes the cap only with one oversized slice"
    eligible = sorted((s for s in sizes if s < limit), reverse=True)
    assert [s.bytes for s in taken] == eligible[:len(taken)], "largest first"
    if len(groups) < max_groups:  # nothing left behind but a lone trailing slice, unless sorting
        assert len(taken) == len(eligible) or (not sort and len(taken) == len(eligible) - 1)
