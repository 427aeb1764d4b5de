"""Secondary indexes: a model test on both table types and every index engine (updates that change an indexed
value, to null too, updates that lose on the ordering field, deletes, compactions, clusterings, resizes,
cleans), the async indexer building one while writer processes write, the CLI, Spark's pushed filters, and
the build on Spark."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import metatable as mt
from indexes import secondary_keys as sk
from metatable.commit import index_records, secondary_records
from metatable.commit.stored_rows import GROUP, HELD, StoredRows
from metatable.errors import InvalidInputError
from metatable.services.index_build import SpilledEntries
from metatable.table_config import KEY_COLUMN

from .table_model import SCHEMA as WRITER_SCHEMA, copy_table
from .test_changes import INDEXES, run_service
from .test_indexer import OPTIONS, indexer, succeeded, wait_for

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("g", pa.int64()), ("h", pa.string()),
                    ("ts", pa.int64())])
G = [0, 1, 2, None]
H = ["x", "y", None]
ROWS = st.lists(st.tuples(st.integers(0, 11), st.sampled_from(["a", "b"]), st.sampled_from(G), st.sampled_from(H),
                          st.integers(0, 3)), min_size=1, max_size=8)
OPERATIONS = st.lists(st.one_of(st.tuples(st.just("upsert"), ROWS), st.tuples(st.just("delete"), ROWS),
                                st.tuples(st.sampled_from(["compact", "cluster", "resize", "clean"]), st.just([]))),
                      min_size=2, max_size=8)


class Model:
    def __init__(self, partitioned: bool) -> None:
        self.partitioned = partitioned
        self.rows: dict[tuple, tuple] = {}  # identity -> (id, p, g, h, ts)
        self.history: list[tuple[str, dict]] = []

    def identity(self, key: int, p: str) -> tuple:
        return (p, key) if self.partitioned else key

    def upsert(self, rows: list[tuple]) -> None:
        for row in rows:
            k = self.identity(row[0], row[1])
            if k not in self.rows or row[4] >= self.rows[k][4]:
                self.rows[k] = row

    def delete(self, rows: list[tuple]) -> None:
        for row in rows:
            self.rows.pop(self.identity(row[0], row[1]), None)

    def by(self, g=..., h=...) -> list[tuple]:
        return sorted((r for r in self.rows.values() if (g is ... or r[2] == g) and (h is ... or r[3] == h)), key=str)


def tuples(table: pa.Table) -> list[tuple]:
    return sorted(((r["id"], r["p"], r["g"], r["h"], r["ts"]) for r in table.to_pylist()), key=str)


def check(table: mt.Table, model: Model) -> None:
    """Every query by value equals the model: present, absent and null values, single and composite, full and
    prefix, get_by and filters (which the index answers)."""
    for g in G + [7]:
        assert tuples(table.get_by("by_g", [g])) == model.by(g=g), f"g = {g}"
        assert tuples(table.get_by("by_gh", [(g,)])) == model.by(g=g), f"g = {g} (prefix)"
        for h in H:
            assert tuples(table.get_by("by_gh", [(g, h)])) == model.by(g=g, h=h), f"(g, h) = {(g, h)}"
        if g is not None:
            assert tuples(table.to_arrow(filter=[("g", "==", g)])) == model.by(g=g)
            assert table.last_scan["secondary_index"] == "by_g"
    both = sorted(model.by(g=0) + model.by(g=2), key=str)
    assert tuples(table.get_by("by_g", [0, 2])) == both
    assert tuples(table.to_arrow(filter=[("g", "in", [0, 2])])) == both
    batches = table.to_batches(filter=[("g", "in", [0, 2])])  # slice by slice, the index's records only
    assert tuples(pa.Table.from_batches(list(batches), batches.schema)) == both
    assert sorted(table.to_arrow(filter=[("g", "in", [0, 2])], columns=["h", "id"]).to_pylist(), key=str) == sorted(
        ({"h": r[3], "id": r[0]} for r in both), key=str)
    assert tuples(table.to_arrow(filter=[("g", "==", 1), ("h", "==", "x")])) == model.by(g=1, h="x")
    assert table.last_scan["secondary_index"] == "by_gh"


@pytest.mark.parametrize("index", sorted(INDEXES))
@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=OPERATIONS)
def test_queries_by_value_equal_the_model(tmp_path, table_type, index, operations):
    config, partitioned, metadata_indexes = INDEXES[index]
    path = str(tmp_path / uuid.uuid4().hex[:8])
    table = mt.Table.create(path, SCHEMA, "id", "p" if partitioned else None, "ts", table_type=table_type, index=config,
                            metadata_indexes=metadata_indexes, secondary_indexes={"by_g": "g", "by_gh": ["g", "h"]},
                            options={"clean.retain_commits": 3, "clean.inline": False,
                                     "compaction.trigger.log_count": 0, "clustering.small_file_limit": 1 << 20})
    model = Model(partitioned)
    snapshots = []
    for operation, rows in operations:
        rows = list({model.identity(r[0], r[1]): r for r in rows}.values())  # a record once per batch
        if operation == "upsert":
            result = table.upsert(pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], schema=SCHEMA))
            model.upsert(rows)
            snapshots.append((result.instant, dict(model.rows)))
        elif operation == "delete":
            keys = pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "p": [r[1] for r in rows]})
            result = table.delete(keys if partitioned else keys.select(["id"]))
            model.delete(rows)
            snapshots.append((result.instant, dict(model.rows)))
        else:
            run_service(table, path, operation, index)
        check(table, model)
    # as of every retained earlier write, queries by value equal the model then
    readable_from = table.context.view().readable_from
    for instant, rows in snapshots:
        if instant >= readable_from:
            then = Model(partitioned)
            then.rows = rows
            assert tuples(table.to_arrow(as_of=instant, filter=[("g", "==", 1)])) == then.by(g=1)
            scan = table.last_scan
            for g, h in ((1, "x"), (None, None), (2, ...)):
                value = (g,) if h is ... else (g, h)
                got, report = table.get_by("by_gh", [value], as_of=instant, explain=True)
                assert tuples(got) == then.by(g=g, h=h), f"{value} as of {instant}"
            if instant != snapshots[-1][0]:  # the index of now, with the records written since, or by stats
                assert scan.get("secondary_index") in (None, "by_g"), scan
                assert report["index"] is None or "written_since" in report, report
    report = table.fsck()
    assert report.healthy, report.problems
    maintained = entries(table, "secondary_index_by_gh")
    table.rebuild_metadata()
    assert entries(table, "secondary_index_by_gh") == maintained  # what a build from the data files holds
    check(table, model)


def entries(table: mt.Table, partition: str) -> list[tuple]:
    """A secondary index's entries, without when they were computed."""
    table.metadata.refresh()
    return [(k, r["value"], r["ordering"], r["partition_path"], r["file_id"])
            for k, r in table.metadata.scan(partition)]


WRITES = st.lists(st.tuples(st.sampled_from(["upsert", "upsert", "delete"]), ROWS), min_size=2, max_size=6)


def test_entries_from_the_rows_a_write_read_equal_the_data(tmp_path_factory, monkeypatch):
    """A merge-on-read write on a simple bucket index reads the rows its keys had (to count updates), and its
    commit computes the secondary index's entries from them (`secondary_records.read_entries`), not from the
    reverse entries: after every write the index equals the data (`fsck`: every entry and no other), with
    values changed, to null and back, rows that lose on the ordering field, deletes, and one id in both
    partitions; queries equal the model. The path was taken."""
    taken = []
    original = secondary_records.read_entries
    monkeypatch.setattr(secondary_records, "read_entries", lambda *args: taken.append(original(*args)) or taken[-1])
    entries_equal_the_data(tmp_path_factory)
    assert sum(entries is not None for entries in taken) > 10


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=WRITES, partitioned=st.booleans())
def entries_equal_the_data(tmp_path_factory, writes, partitioned):
    path = str(tmp_path_factory.mktemp("written"))
    table = mt.Table.create(path, SCHEMA, "id", "p" if partitioned else None, "ts", index=mt.IndexConfig(num_buckets=2),
                            secondary_indexes={"by_g": "g", "by_gh": ["g", "h"]},
                            options={"compaction.mode": "off", "clean.inline": False})
    model = Model(partitioned)
    for operation, rows in writes:
        rows = list({model.identity(r[0], r[1]): r for r in rows}.values())
        if operation == "upsert":
            table.upsert(pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], schema=SCHEMA))
            model.upsert(rows)
        else:
            keys = pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "p": [r[1] for r in rows]})
            table.delete(keys if partitioned else keys.select(["id"]))
            model.delete(rows)
        report = table.fsck()
        assert report.healthy, report.problems
    check(table, model)


def test_written_rows_are_paired_with_the_rows_read_by_order_only_where_the_keys_agree():
    """`_in_order` pairs a commit's written rows with what its write read, group after group in the write's
    order; rows in another order (or other rows) are paired by key instead (`_rows_of`), also where one key is
    held in two groups (two partitions' records)."""
    read = StoredRows((("p=a", "0"), ("p=b", "0")), pa.table({
        GROUP: pa.array([1, 0, 1, 0], pa.int32()), KEY_COLUMN: ["1", "1", "2", "3"],
        HELD: [True, False, True, True], "g": [10, None, 20, 30]}))
    held = read.rows[HELD].to_numpy(zero_copy_only=False)
    numbers = np.array([0, 1], np.int32)  # the commit's files: group 0's, then group 1's
    assert secondary_records._in_order(pa.array(["1", "3", "1", "2"]), read, numbers, held).to_pylist() == [
        None, 3, 0, 2]
    assert secondary_records._in_order(pa.array(["3", "1", "1", "2"]), read, numbers, held) is None
    mine = np.flatnonzero(held)
    found = secondary_records._rows_of(np.array([0, 0, 1, 1]), pa.array(["3", "1", "2", "1"]),
                                       read.rows[GROUP].to_numpy()[mine],
                                       read.rows[KEY_COLUMN].take(pa.array(mine)).combine_chunks())
    assert pa.array(mine).take(found).to_pylist() == [3, None, 2, 0]


def test_a_write_whose_file_group_another_write_changed_meanwhile_reads_the_reverse_entries(tmp_path):
    """A writer process reads its keys' rows, then waits before its commit while this process changes the same
    record's indexed value and commits: the waiting commit must not take the old value it read (its file group
    changed since), or the index keeps a forward entry of a value no row has."""
    root = str(tmp_path / "t")
    table = mt.Table.create(root, WRITER_SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=1),
                            secondary_indexes={"by_v": "v"})
    table.upsert(pa.Table.from_pylist([{"id": 1, "p": "a", "v": "old", "ts": 1}], schema=WRITER_SCHEMA))
    release = str(tmp_path / "release")
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, pyarrow as pa, metatable as mt\n"
        "from tests.metatable.table_model import SCHEMA\n"
        f"mt.Table.open({root!r}).upsert(pa.Table.from_pylist([{{'id': 1, 'p': 'a', 'v': 'late', 'ts': 3}}], "
        "schema=SCHEMA))\n")], env={**os.environ, "METATABLE_PAUSE_AT": f"table.write.files:{release}"},
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    wait_for(lambda: os.path.exists(release + ".reached"), timeout=60)
    table.upsert(pa.Table.from_pylist([{"id": 1, "p": "a", "v": "meanwhile", "ts": 2}], schema=WRITER_SCHEMA))
    open(release, "w").close()
    assert child.wait(timeout=60) == 0
    table = mt.Table.open(root)
    assert table.fsck().healthy, table.fsck().problems
    assert table.get_by("by_v", ["late"]).num_rows == 1
    forward = [e[0].split(sk.KEY_SEP)[0] for e in entries(table, "secondary_index_by_v")
               if not e[0].startswith(sk.KEY_SEP)]
    assert forward == ["=late"]


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_a_query_as_of_an_earlier_instant_reads_through_the_index_of_now(tmp_path, table_type):
    """As of an earlier write, `get_by` reads the rows the index names now and the records written since, and a
    filter the slices that hold them: a row whose value changed, one deleted and one inserted since are found
    as they were; once the writes since name more files than the snapshot has slices, both read by stats."""
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts", table_type=table_type,
                            index=mt.IndexConfig(num_buckets=4), secondary_indexes={"by_g": "g"})
    rows = [(i, "ab"[i % 2], i % 5, "x", 1) for i in range(40)]
    then = table.upsert(pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], schema=SCHEMA)).instant
    table.upsert(pa.Table.from_pylist([{"id": 1, "p": "b", "g": 3, "h": "y", "ts": 2},  # g 1 -> 3
                                       {"id": 40, "p": "a", "g": 1, "h": "y", "ts": 2}], schema=SCHEMA))  # new
    table.delete(pa.table({"id": pa.array([6], pa.int64()), "p": ["a"]}))  # g 1, deleted
    expected = sorted((r for r in rows if r[2] == 1), key=str)
    got, report = table.get_by("by_g", [1], as_of=then, explain=True)
    assert tuples(got) == expected and len(expected) == 8
    assert report["index"] == "secondary_index_by_g" and report["written_since"] == 3, report
    for values in ([("g", "==", 1)], [("g", "in", [1, 4]), ("h", "==", "x")]):  # a filter: the slices of those
        assert tuples(table.to_arrow(as_of=then, filter=values)) == sorted(
            (r for r in rows if r[2] in ([1] if len(values) == 1 else [1, 4])), key=str)
        assert table.last_scan["secondary_index"] == "by_g", table.last_scan
    assert table.last_scan["skipped"] > 0, table.last_scan
    if table_type == "merge_on_read":  # base files only: the index, which holds what the logs say, is not asked
        assert tuples(table.to_arrow(read_optimized=True, filter=[("g", "==", 1)])) == expected
        assert "secondary_index" not in table.last_scan, table.last_scan
    assert tuples(table.get_by("by_g", [1])) == sorted([r for r in expected if r[0] not in (1, 6)] +
                                                       [(40, "a", 1, "y", 2)], key=str)
    for n in range(8):  # writes since that name more files than the snapshot's 8 slices
        table.upsert(pa.Table.from_pylist([{"id": 100 + n, "p": "ab"[n % 2], "g": 0, "h": "z", "ts": 3}],
                                          schema=SCHEMA))
    got, report = table.get_by("by_g", [1], as_of=then, explain=True)
    assert tuples(got) == expected and report["index"] is None, report
    assert tuples(table.to_arrow(as_of=then, filter=[("g", "==", 1)])) == expected
    assert "secondary_index" not in table.last_scan, table.last_scan


def test_key_encoding_vectors():
    assert sk.tokens([pa.array(["a\x1eb", "", None]), pa.array([1, None, 3])]).to_pylist() == [
        "=a\x1d1b\x1f=1", "=\x1f!", "!\x1f=3"]
    assert sk.value_tokens([-0.0], [pa.float64()]) == sk.value_tokens([0.0], [pa.float64()]) == ["=0"]
    assert sk.value_tokens([True, None], [pa.bool_(), pa.string()]) == ["=true\x1f!"]
    ts = pa.array([1_700_000_000_123_456], pa.timestamp("us", tz="UTC"))
    assert sk.texts(ts).to_pylist() == ["1700000000123456"]
    assert sk.forward_keys(pa.array(["=1"]), pa.array(["k"])).to_pylist() == ["=1\x1ek"]
    assert sk.reverse_keys(pa.array(["k"])).to_pylist() == ["\x1ek"]
    assert sk.scan_prefix("=1", whole=False) == "=1\x1f" and sk.index_key_of("=1\x1f!\x1ek\x1ex") == "k\x1ex"


@given(values=st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)), min_size=1),
       floats=st.lists(st.floats(allow_nan=False), min_size=1), strings=st.lists(st.text(), min_size=1))
def test_texts_round_trip_and_tokens_are_distinct(values, floats, strings):
    for array in (pa.array(values, pa.int64()), pa.array(values, pa.int64()).view(pa.timestamp("us"))):
        assert sk.from_texts(sk.texts(array), array.type).equals(array)
    array = pa.array(floats, pa.float64())
    assert sk.from_texts(sk.texts(array), array.type).to_pylist() == [v + 0.0 for v in floats]  # -0.0 is 0.0
    tokens = sk.tokens([pa.array(strings, pa.string())]).to_pylist()
    assert len(set(tokens)) == len(set(strings))  # distinct values, distinct tokens
    assert all(sk.KEY_SEP not in t and sk.COLUMN_SEP not in t for t in tokens)


def test_declaring_and_refusals(tmp_path):
    with pytest.raises(InvalidInputError, match="not in the table"):
        mt.Table.create(str(tmp_path / "a"), SCHEMA, "id", secondary_indexes={"by_x": ["x"]})
    with pytest.raises(InvalidInputError, match="lower-case"):
        mt.Table.create(str(tmp_path / "b"), SCHEMA, "id", secondary_indexes={"By X": ["g"]})
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", secondary_indexes={"by_g": "g"})
    assert table.indexes() == {"column_stats": "ready", "secondary_index_by_g": "ready"}
    with pytest.raises(InvalidInputError, match="no secondary index 'by_h'"):
        table.get_by("by_h", ["x"])
    with pytest.raises(InvalidInputError, match="takes 1 to 1 values"):
        table.get_by("by_g", [(1, 2)])
    with pytest.raises(InvalidInputError, match="already indexed"):
        table.schedule_indexing(secondary={"by_g": ["g"]})
    table.schedule_indexing(secondary={"by_h": ["h"]})
    with pytest.raises(InvalidInputError, match="still building"):
        table.get_by("by_h", ["x"])
    table.drop_index("secondary_index_by_h")
    assert table.config.secondary_indexes == {"by_g": ("g",)}


def seeded(root: str) -> mt.Table:
    table = mt.Table.create(root, WRITER_SCHEMA, "id", partition_by="p", ordering_field="ts",
                            index=mt.IndexConfig(num_buckets=2), options=OPTIONS)
    for p in ("p0", "p1"):
        table.upsert(pa.Table.from_pylist([{"id": i, "p": p, "v": f"seed-{i % 7}", "ts": 1} for i in range(300)],
                                          schema=WRITER_SCHEMA))
    return table


def test_fsck_finds_each_kind_of_wrong_entry_and_the_rebuild_mends_it(tmp_path):
    from metatable.metadata.records import KINDS
    table = mt.Table.create(str(tmp_path / "t"), WRITER_SCHEMA, "id", partition_by="p", options=OPTIONS,
                            secondary_indexes={"by_v": "v"})
    table.upsert(pa.Table.from_pylist([{"id": i, "p": "p0", "v": f"v{i % 3}", "ts": 1} for i in range(20)],
                                      schema=WRITER_SCHEMA))
    partition = "secondary_index_by_v"
    stored = dict(table.metadata.scan(partition))
    forward = next(k for k in stored if not k.startswith(sk.KEY_SEP))
    reverse = next(k for k in stored if k.startswith(sk.KEY_SEP) and k[1:] != forward.split(sk.KEY_SEP)[1])
    late = 2**62  # computed after everything stored: it wins
    last = table.timeline()[-1].time
    table.metadata.append(last, {partition: {
        forward: {**KINDS["secondary_index"].tombstone(), "written_at": late},
        reverse: {**stored[reverse], "value": "=elsewhere", "written_at": late},
        f"=ghost{sk.KEY_SEP}{reverse[1:]}x": {**stored[forward], "written_at": late}}}, token=f"{last}-damage")
    table.metadata.reread()
    problems = table.fsck().problems
    assert len(problems) == 1 and f"3 entries of {partition} disagree with the data" in problems[0].detail
    assert f"no entry {forward!r}" in problems[0].detail
    table.rebuild_metadata()
    assert table.fsck().healthy and entries(table, partition) == sorted(
        (k, r["value"], r["ordering"], r["partition_path"], r["file_id"]) for k, r in stored.items())


def test_a_build_in_small_pieces_equals_one_built_whole(tmp_path, monkeypatch):
    """The build streams: base files read a few rows at a time, entries sorted in runs of a few and merged.
    Its index equals one built with the default sizes, and queries equal a filter of a full read."""
    root = str(tmp_path / "t")
    table = seeded(root)
    table.upsert(pa.Table.from_pylist([{"id": i, "p": "p0", "v": f"new-{i % 5}", "ts": 2} for i in range(0, 300, 7)],
                                      schema=WRITER_SCHEMA))
    table.upsert(pa.Table.from_pylist([{"id": i, "p": "p1", "v": "lost", "ts": 0} for i in range(0, 300, 11)],
                                      schema=WRITER_SCHEMA))
    table.delete(pa.table({"id": pa.array(range(1, 300, 13), pa.int64()), "p": ["p0"] * 23}))
    whole = str(tmp_path / "whole")
    copy_table(root, whole)
    for built in (whole, root):
        if built == root:
            monkeypatch.setattr(index_records, "BATCH_ROWS", 17)
            monkeypatch.setattr(SpilledEntries, "RUN_ENTRIES", 29)
        t = mt.Table.open(built, options=OPTIONS)
        t.schedule_indexing(secondary={"by_v": "v"})
        t.run_indexing()
    check_against_the_data(root, tmp_path)
    assert entries(mt.Table.open(root), "secondary_index_by_v") == entries(mt.Table.open(whole), "secondary_index_by_v")


def check_against_the_data(root: str, tmp_path, from_scratch: bool = False) -> None:
    """fsck finds the index equal to the data (every entry and no other); queries equal a filter of a full
    read; `from_scratch`: the index also equals one built from scratch on a copy."""
    table = mt.Table.open(root, options=OPTIONS)
    assert table.indexes()["secondary_index_by_v"] == "ready"
    report = table.fsck()
    assert report.healthy, report.problems
    data = table.to_arrow()
    for v in sorted(set(data["v"].to_pylist()))[:12] + ["absent"]:
        want = sorted(r["id"] * 10 + int(r["p"][1]) for r in data.to_pylist() if r["v"] == v)
        got = table.get_by("by_v", [v])
        assert sorted(r["id"] * 10 + int(r["p"][1]) for r in got.to_pylist()) == want, v
    if not from_scratch:
        return
    copy = str(tmp_path / f"scratch-{time.time_ns()}")
    copy_table(root, copy)
    scratch = mt.Table.open(copy, options=OPTIONS)
    scratch.drop_index("secondary_index_by_v")
    scratch.schedule_indexing(secondary={"by_v": "v"})
    scratch.run_indexing()
    assert entries(scratch, "secondary_index_by_v") == entries(table, "secondary_index_by_v")


def test_the_async_indexer_builds_one_while_writers_write_and_drops_it(tmp_path, monkeypatch):
    """Two writer processes upsert and delete (with ordering values that lose, too) for the whole indexing;
    commits during the build leave the index to the indexer's catch-up, commits after it write it. Then it is
    dropped while they write."""
    root = str(tmp_path / "t")
    table = seeded(root)
    stop = str(tmp_path / "stop")
    timeline = table.context.timeline

    def two_commits_after(after: str) -> None:  # writers' commits observed, not waited for by the clock
        wait_for(lambda: sum(i.time > after for i in timeline.completed()) >= 2, timeout=60)

    seeds = timeline.completed()[-1].time
    writers = [indexer(root, "write", str(seed), stop) for seed in (0, 1)]
    two_commits_after(seeds)
    monkeypatch.setenv("METATABLE_PAUSE_AT", "indexer.built:1")  # they commit while the build waits
    indexing = table.schedule_indexing(secondary={"by_v": ["v"]})
    table.run_indexing()

    def written_by_a_commit() -> bool:  # commits after the index is ready write it themselves
        return any("secondary_index_by_v" in timeline.read_json(i).get("indexes", {})
                   for i in timeline.completed() if i.time > indexing)

    wait_for(written_by_a_commit, timeout=60)
    open(stop, "w").close()
    assert all(json.loads(succeeded(w)) > 0 for w in writers)
    check_against_the_data(root, tmp_path, from_scratch=True)

    stop = str(tmp_path / "stop-again")
    before = timeline.completed()[-1].time
    writers = [indexer(root, "write", str(seed), stop) for seed in (2, 3)]
    two_commits_after(before)
    assert json.loads(succeeded(indexer(root, "drop", "secondary_index_by_v"))) == []
    two_commits_after(timeline.completed()[-1].time)  # they write on after the drop
    open(stop, "w").close()
    assert all(json.loads(succeeded(w)) > 0 for w in writers)
    table = mt.Table.open(root, options=OPTIONS)
    assert "secondary_index_by_v" not in table.indexes() and table.config.secondary_indexes == {}
    assert table.fsck().healthy


@pytest.mark.slow
@pytest.mark.parametrize("point", ["indexer.build.file_group", "indexer.catch_up"])
def test_sigkill_of_the_build_at_named_points(tmp_path, point):
    """The build is held once built until the writers have committed twice more, so that its catch-up has
    instants to apply (held for a second instead, a slow start let the writers finish first)."""
    root = str(tmp_path / "t")
    timeline = seeded(root).context.timeline
    stop, hold = str(tmp_path / "stop"), str(tmp_path / "hold")
    writers = [indexer(root, "write", str(seed), stop) for seed in (0, 1)]
    held = {"METATABLE_PAUSE_AT": f"indexer.built:{hold}"} if point == "indexer.catch_up" else {}
    killed = indexer(root, "schedule_run", "by_v=v", METATABLE_CRASH_AT=f"{point}:1", **held)
    if held:
        wait_for(lambda: os.path.exists(hold + ".reached"), timeout=60)
        seen = timeline.completed()[-1].time
        wait_for(lambda: sum(i.time > seen for i in timeline.completed()) >= 2, timeout=60)
        open(hold, "w").close()
    assert killed.wait(60) == -signal.SIGKILL
    open(stop, "w").close()
    assert all(json.loads(succeeded(w)) > 0 for w in writers)
    time.sleep(2.5)  # the dead indexer's heartbeat expires
    mt.Table.open(root, options=OPTIONS).run_indexing()
    check_against_the_data(root, tmp_path)


@pytest.mark.slow
def test_sigkill_of_the_build_at_random_moments(tmp_path):
    root = str(tmp_path / "t")
    seeded(root)
    writer = indexer(root, "write", "0", str(time.time() + 3))
    proc = indexer(root, "schedule_run", "by_v=v")
    time.sleep(random.Random(11).uniform(0.3, 2.0))
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert json.loads(succeeded(writer)) > 0
    time.sleep(2.5)
    table = mt.Table.open(root, options=OPTIONS)
    if table.indexes().get("secondary_index_by_v") is None:
        table.schedule_indexing(secondary={"by_v": "v"})
    table.run_indexing()
    check_against_the_data(root, tmp_path)


def test_the_cli_declares_schedules_queries_and_drops(tmp_path, capsys):
    from metatable.cli import main
    path = str(tmp_path / "t")
    data = tmp_path / "in.parquet"
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"id": list(range(20)), "p": ["a"] * 20, "g": [i % 3 for i in range(20)],
                             "h": [str(i % 2) for i in range(20)], "ts": [1] * 20}).cast(SCHEMA), str(data))
    main(["create", path, "--schema", "id:int64,p:string,g:int64,h:string,ts:int64", "--key", "id",
          "--secondary", "by_gh=g,h"])
    main(["upsert", path, str(data)])
    capsys.readouterr()
    main(["get-by", path, "by_gh", "1,0", "2", "--output", "json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["id"] for r in rows) == sorted([i for i in range(20) if i % 3 == 1 and i % 2 == 0] +
                                                   [i for i in range(20) if i % 3 == 2])
    main(["index", "schedule", path, "--secondary", "by_h=h"])
    main(["index", "run", path, "--nice", "0"])
    main(["index", "status", path, "--output", "json"])
    status = {json.loads(line)["partition"]: json.loads(line) for line in capsys.readouterr().out.splitlines()
              if line.startswith("{")}
    assert status["secondary_index_by_h"]["state"] == "ready" and status["secondary_index_by_h"]["records"] == 40
    main(["index", "drop", path, "secondary_index_by_h"])
    assert mt.Table.open(path).config.secondary_indexes == {"by_gh": ("g", "h")}


def test_spark_reads_only_the_slices_the_index_names_and_builds_alike(spark, tmp_path):
    path = str(tmp_path / "t")
    table = mt.Table.create(path, SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=4),
                            secondary_indexes={"by_g": "g"})
    table.upsert(pa.Table.from_pylist([{"id": i, "p": "ab"[i % 2], "g": i, "h": "x", "ts": 1} for i in range(200)],
                                      schema=SCHEMA))
    df = spark.read.format("metatable").load(path).filter("g in (7, 8)")
    assert sorted(r["id"] for r in df.collect()) == [7, 8]
    assert df.rdd.getNumPartitions() == 2  # of 8 file slices, the two that hold them
    then = table.timeline()[-1].time
    table.upsert(pa.Table.from_pylist([{"id": 9, "p": "b", "g": 7, "h": "y", "ts": 2}], schema=SCHEMA))  # 9 -> 7
    df = spark.read.format("metatable").option("as_of", then).load(path).filter("g in (7, 8)")
    assert sorted((r["id"], r["h"]) for r in df.collect()) == [(7, "x"), (8, "x")]  # as of then, through the index
    assert df.rdd.getNumPartitions() == 2, df.rdd.getNumPartitions()
    now = spark.read.format("metatable").load(path).filter("g == 7")
    assert sorted((r["id"], r["h"]) for r in now.collect()) == [(7, "x"), (9, "y")]
    copy = str(tmp_path / "copy")
    copy_table(path, copy)
    built = mt.Table.open(copy)
    built.drop_index("secondary_index_by_g")
    built.schedule_indexing(secondary={"by_g": "g"})
    built.run_indexing(spark=spark)
    original = mt.Table.open(path)
    assert [k for k, _ in built.metadata.scan("secondary_index_by_g")] == [
        k for k, _ in original.metadata.scan("secondary_index_by_g")]
    assert tuples(built.get_by("by_g", [3])) == tuples(original.get_by("by_g", [3]))


RECORDS = st.lists(st.fixed_dictionaries({
    "partition_path": st.text(max_size=300), "file_id": st.text(max_size=5),
    "completed_at": st.integers(-2**63, 2**63 - 1), "written_at": st.integers(-2**63, 2**63 - 1),
    "is_deleted": st.booleans(), "value": st.one_of(st.none(), st.text(max_size=200)),
    "ordering": st.one_of(st.none(), st.text(max_size=3))}), min_size=1, max_size=40)


@given(records=RECORDS)
def test_column_encoding_is_fastavros_byte_for_byte(records):
    import io

    import fastavro

    from avro_schemas import schema
    from metatable.formats.avro_columns import decode_columns, encode_columns
    parsed = schema("secondary_index")
    types = {"completed_at": pa.int64(), "written_at": pa.int64(), "is_deleted": pa.bool_()}
    columns = {f["name"]: pa.array([r[f["name"]] for r in records], types.get(f["name"], pa.string()))
               for f in parsed["fields"]}
    for shared in ({}, {"partition_path": "p=x", "written_at": 7, "value": None}):
        got = encode_columns(parsed, {**columns, **shared}, len(records))
        theirs = []
        for raw, record in zip(got.to_pylist(), records):
            buffer = io.BytesIO()
            fastavro.schemaless_writer(buffer, parsed, {**record, **shared})
            assert raw == buffer.getvalue()
            theirs.append(buffer.getvalue())
        assert decode_columns(parsed, pa.array(theirs, pa.binary())).to_pylist() == [
            {**r, **shared} for r in records]
        assert decode_columns(parsed, got.slice(1)).to_pylist() == [{**r, **shared} for r in records[1:]]


def test_column_decoding_refuses_what_is_not_a_record():
    from avro_schemas import schema
    from metatable.formats.avro_columns import decode_columns
    parsed = schema("secondary_index")
    whole = b"\x06p=1\x02f\x02\x04\x00\x02\x04=1\x00"  # "p=1", "f", 1, 2, false, "=1", null
    assert decode_columns(parsed, pa.array([whole])).to_pylist() == [
        {"partition_path": "p=1", "file_id": "f", "completed_at": 1, "written_at": 2, "is_deleted": False,
         "value": "=1", "ordering": None}]
    for bad in (whole + b"\x00", whole[:-1], b"\x7ep=1"):  # a byte too many, too few, a string past the end
        with pytest.raises(ValueError):
            decode_columns(parsed, pa.array([whole, bad]))
