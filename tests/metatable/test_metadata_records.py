"""Merge rules (DESIGN.md, contract) against plain-Python models, with hypothesis."""
from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from indexes.column_stats import stat_value

from metatable.formats.log_file import Entries
from metatable.metadata.records import KINDS, MetadataIntegrityError

FILES, BLOOM, STATS, RING, RECORDS = (KINDS[k] for k in ("files", "bloom_filter", "column_stats", "hashing_meta",
                                                         "record_index"))
NAMES = ["a", "b", "c", "d"]


def size_of(name: str) -> int:
    # metatable never reuses a file name, so a name always has one size; the max rule gets its own test
    return 10 * (NAMES.index(name) + 1)


file_entry = st.sampled_from(NAMES).flatmap(
    lambda n: st.booleans().map(lambda dead: (n, {"size": size_of(n), "is_deleted": dead})))
files_record = st.builds(
    lambda entries, deleted: {"files": dict(entries), "is_deleted": deleted},
    st.lists(file_entry, max_size=4), st.booleans())

stat_scalar = st.one_of(st.none(), st.integers(-100, 100))
stats_record = st.builds(
    lambda lo, hi, nulls, n, size, deleted: {
        "file_name": "f", "column_name": "c",
        "min_value": None if lo is None or hi is None else min(lo, hi),
        "max_value": None if lo is None or hi is None else max(lo, hi),
        "null_count": nulls, "value_count": n, "total_size": size, "is_deleted": deleted, "resets": False},
    stat_scalar, stat_scalar, st.integers(0, 5), st.integers(0, 5), st.integers(0, 100), st.booleans())
bloom_record = st.builds(
    lambda payload, deleted: {"file_name": "f", "filter_type": "t", "instant": "1", "bloom_filter": payload,
                              "is_deleted": deleted},
    st.binary(max_size=4), st.booleans())


def rings(n):
    return [{"version": 1, "partition_path": "p", "instant": str(i), "seq_no": i, "num_buckets": 1,
             "nodes": [{"value": i, "file_id_prefix": "x", "tag": "NORMAL"}], "is_deleted": d}
            for i, d in enumerate(n)]


record_entry = st.builds(
    lambda file_id, stamp, deleted: {"partition_path": "p", "file_id": file_id, "instant": "1",
                                     "completed_at": stamp, "is_deleted": deleted},
    st.sampled_from(["f1", "f2", "f3"]), st.integers(0, 4), st.booleans())

KIND_STRATEGIES = [(FILES, files_record), (STATS, stats_record), (BLOOM, bloom_record), (RECORDS, record_entry)]


@pytest.mark.parametrize("kind,records", KIND_STRATEGIES, ids=lambda x: getattr(x, "name", ""))
def test_associative(kind, records):
    @given(records, records, records)
    def check(a, b, c):
        assert kind.merge(kind.merge(a, b), c) == kind.merge(a, kind.merge(b, c))
    check()


@pytest.mark.parametrize("kind,records", KIND_STRATEGIES, ids=lambda x: getattr(x, "name", ""))
def test_base_plus_logs_equals_logs_only(kind, records):
    """Compacting any prefix into a base (dropping what is absent) never changes what readers see. (A record
    index log written after a compaction completed after everything compacted: its stamps are later.)"""
    @given(st.lists(records, min_size=1, max_size=8), st.integers(0, 8))
    def check(history, cut):
        cut = min(cut, len(history))
        if kind is RECORDS:
            history = history[:cut] + [{**r, "completed_at": r["completed_at"] + 10} for r in history[cut:]]
        everything = kind.fold(history)
        base = kind.compacted(kind.fold(history[:cut])) if cut else None
        rest = history[cut:]
        after = kind.fold(([base] if base is not None else []) + rest)
        expected = kind.visible(everything)
        assert (kind.visible(after) if after is not None else None) == expected
        # and logs merged among themselves first, then onto the base
        if rest and base is not None:
            assert kind.visible(kind.merge(base, kind.fold(rest))) == expected
    check()


def files_model(history):
    live: dict[str, int] = {}
    for r in history:
        if r["is_deleted"]:
            live = {}
        for name, e in r["files"].items():
            if e["is_deleted"]:
                if not r["is_deleted"]:
                    live.pop(name, None)
            else:
                live[name] = max(live.get(name, 0), e["size"])
    return live


@given(st.lists(files_record, min_size=1, max_size=10))
def test_files_against_model(history):
    got = FILES.visible(FILES.fold(history))
    model = files_model(history)
    assert (got or {"files": {}})["files"] == {n: {"size": s, "is_deleted": False} for n, s in model.items()}


@given(st.lists(files_record, min_size=1, max_size=10))
def test_shared_files_records_are_never_changed_by_a_read(history):
    """`files` records are decoded once per process and shared by every reader (`shares_records`): folding,
    compacting and showing them must leave the decoded objects as they were, and decoding the same bytes
    again gives the same record."""
    assert FILES.shares_records
    decoded = FILES.decode_many([FILES.encode(r) for r in history])
    assert decoded == history
    FILES.visible(FILES.fold(decoded))
    FILES.compacted(FILES.fold(decoded))
    for older, newer in zip(decoded, decoded[1:]):
        FILES.visible(FILES.merge(older, newer))
    assert decoded == history
    assert [FILES.decode(FILES.encode(r)) for r in history] == history
    assert all(a is b for a, b in zip(FILES.decode_many([FILES.encode(r) for r in history]), decoded))


def stats_model(history):
    state = None
    for r in history:
        if r["is_deleted"]:
            state = None
        elif state is None:
            state = dict(r)
        else:
            mins = [v for v in (state["min_value"], r["min_value"]) if v is not None]
            maxs = [v for v in (state["max_value"], r["max_value"]) if v is not None]
            state = {**state, "min_value": min(mins) if mins else None, "max_value": max(maxs) if maxs else None,
                     **{k: state[k] + r[k] for k in ("null_count", "value_count", "total_size")}}
    return None if state is None else {k: v for k, v in state.items() if k != "resets"}


@given(st.lists(stats_record, min_size=1, max_size=10))
def test_column_stats_against_model(history):
    assert STATS.visible(STATS.fold(history)) == stats_model(history)


@given(st.lists(bloom_record, min_size=1, max_size=10))
def test_bloom_newer_wins(history):
    assert BLOOM.visible(BLOOM.fold(history)) == (None if history[-1]["is_deleted"] else history[-1])


@given(st.lists(st.sampled_from(NAMES), min_size=1), st.sampled_from(NAMES), st.lists(files_record, max_size=4))
def test_tombstone_never_resurrects(before, victim, after):
    """A file tombstoned stays gone unless a later record adds it again."""
    added = {"files": {n: {"size": size_of(n), "is_deleted": False} for n in before}, "is_deleted": False}
    kill = {"files": {victim: {"size": 0, "is_deleted": True}}, "is_deleted": False}
    visible = FILES.visible(FILES.fold([added, kill, *after])) or {"files": {}}
    alive = False  # only a later live entry can bring it back; a later key tombstone clears it again
    for r in after:
        if r["is_deleted"]:
            alive = False
        if victim in r["files"] and (not r["is_deleted"] or not r["files"][victim]["is_deleted"]):
            alive = not r["files"][victim]["is_deleted"]
    assert (victim in visible["files"]) == alive


@given(st.lists(st.booleans(), min_size=3, max_size=8))
def test_hashing_meta_newer_wins_and_is_associative(deleted):
    history = rings(deleted)
    assert RING.fold(history) == history[-1]
    a, b, c = history[:3]
    assert RING.merge(RING.merge(a, b), c) == RING.merge(a, RING.merge(b, c))


def test_hashing_meta_rejects_going_back():
    a, b = rings([False, False])
    with pytest.raises(MetadataIntegrityError, match="does not advance"):
        RING.merge(b, a)
    with pytest.raises(MetadataIntegrityError, match="must be 1"):
        RING.check_successor(a, {**b, "seq_no": 5})
    RING.check_successor(a, b)
    RING.check_successor(None, b)


def test_files_size_is_max_of_both():
    old = {"files": {"a": {"size": 10, "is_deleted": False}}, "is_deleted": False}
    new = {"files": {"a": {"size": 7, "is_deleted": False}}, "is_deleted": False}
    assert FILES.merge(old, new)["files"]["a"]["size"] == 10
    tomb_absent = {"files": {"z": {"size": 0, "is_deleted": True}}, "is_deleted": False}
    assert "z" in FILES.merge(old, tomb_absent)["files"]  # kept, so log+log and base+log agree


def test_typed_stats_round_trip():
    rec = {"file_name": "f", "column_name": "d", "min_value": {"days": dt.date(2020, 1, 1)},
           "max_value": {"micros": dt.datetime(2021, 1, 1, tzinfo=dt.timezone.utc)}, "null_count": 0,
           "value_count": 1, "total_size": 1, "is_deleted": False, "resets": False}
    back = STATS.decode(STATS.encode(rec))
    assert stat_value(back["min_value"]) == dt.date(2020, 1, 1)
    assert stat_value(back["max_value"]) == dt.datetime(2021, 1, 1, tzinfo=dt.timezone.utc)
    merged = STATS.merge(back, {**rec, "min_value": {"days": dt.date(2019, 5, 5)}, "max_value": None})
    assert stat_value(merged["min_value"]) == dt.date(2019, 5, 5)


@given(st.lists(record_entry, min_size=1, max_size=10))
def test_record_index_latest_completion_wins(history):
    """The entry of the latest completion (the later one on a tie) is what readers see; a tombstone there
    means absent."""
    latest = max(range(len(history)), key=lambda i: (history[i]["completed_at"], i))
    expected = None if history[latest]["is_deleted"] else history[latest]
    assert RECORDS.visible(RECORDS.fold(history)) == expected


def test_record_index_encoding_is_reused_per_entry():
    entry = {"partition_path": "p=a", "file_id": "f", "instant": "20260101000000000", "completed_at": 7,
             "is_deleted": False}
    first = RECORDS.encode(entry)
    assert RECORDS.encode(entry) is first
    assert RECORDS.decode(first) == entry
    assert RECORDS.decode(RECORDS.encode({**entry, "file_id": "g"}))["file_id"] == "g"


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "é"]), record_entry), max_size=30))
def test_record_index_merges_columns_as_records(versions):
    """The columnar compaction against folding each key's records (oldest first) and `compacted`."""
    entries = Entries(pa.array([k for k, _ in versions], pa.large_string()),
                      pa.array([RECORDS.encode(r) for _, r in versions], pa.large_binary()))
    expected = []
    for key in sorted({k for k, _ in versions}):
        merged = RECORDS.compacted(RECORDS.fold([r for k, r in versions if k == key]))
        if merged is not None:
            expected.append((key, merged))
    assert [(k, RECORDS.decode(v)) for k, v in RECORDS.compacted_columns(entries).pairs()] == expected
