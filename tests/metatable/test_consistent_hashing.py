"""The consistent-hashing bucket index through the public API: the dict model under random writes, resizes,
compactions and cleans; RFC-42's test plan; SIGKILLed resizes; writers and readers in other processes."""
from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
import tempfile
import time
from typing import Callable

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import Phase, event, given, settings, strategies as st

import metatable as mt
from avro_schemas import schema
from indexes.arrow_keys import hash32_array
from indexes.consistent_hashing import initial_ring
from indexes.keys import hashing_meta_key

from metatable.errors import ConflictError, InvalidInputError
from metatable.file_group.base_file import PARQUET
from metatable.file_group.file_slice import parse_names
from metatable.metadata.table import MetadataTable
from metatable.timeline.instant import Action

from .strategies import rows_strategy
from .table_model import SCHEMA, TableModel, check_metadata, sort_rows
from .test_clustering import model_of
from .test_indexer import expected, stored
from .test_write_concurrency import act, all_succeed, child, finished, held_at, release, rows, wait_held

BASE = {"heartbeat.interval_s": 0.05, "heartbeat.tolerable_misses": 2, "clean.retain_commits": 3,
        "clean.inline": False}
GROW = {"write.target_file_size": 1200, "bucket.split_threshold": 1.0, "bucket.merge_threshold": 0.0}
SHRINK = {"write.target_file_size": 1 << 20, "bucket.merge_threshold": 1.0}
# for tests with live processes side by side: a beat every 0.5 s, dead after 3 s. Every process must judge
# heartbeats as the beating one does (BASE's 0.1 s would have a loaded process roll back a live writer)
LIVE = {"heartbeat.interval_s": 0.5, "heartbeat.tolerable_misses": 6}


def ch_index(n: int = 2) -> mt.IndexConfig:
    return mt.IndexConfig(type="bucket", engine="consistent_hashing", num_buckets=n)


def create(root: str, table_type: str = "merge_on_read", partitioned: bool = True, buckets: int = 2,
           options: dict | None = None) -> mt.Table:
    return mt.Table.create(root, SCHEMA, "id", "p" if partitioned else None, "ts", table_type=table_type,
                           index=ch_index(buckets), metadata_indexes=["column_stats", "record_index"],
                           options={**BASE, **(options or {})})


def with_options(table: mt.Table, options: dict) -> mt.Table:
    return mt.Table.open(table.path, options={**BASE, **options})


def rings(table: mt.Table) -> dict:
    return table.context.view().rings


def check_placement(table: mt.Table, partitioned: bool) -> None:
    """Every live key sits in the file group that the ring in hashing_meta maps it to (found by reading the
    files, not through the ring), and `get` through the ring returns every row."""
    data = table.to_arrow()
    if data.num_rows == 0:
        return
    keys = data.select(["id", "p"] if partitioned else ["id"])
    found = table.lookup(keys, using="metadata")
    view = table.context.view()
    partitions = found["partition"].combine_chunks()
    expected = view.bucket_assigner(table.config.index).file_ids(found["key"].combine_chunks(), partitions)
    assert found["file_id"].to_pylist() == expected.to_pylist()
    assert sort_rows(table.get(keys).to_pylist()) == sort_rows(data.to_pylist()), "get goes through the ring"


def check_seq_nos(table: mt.Table) -> None:
    """seq_no rose by one per committed resize of the partition."""
    resizes: dict[str, int] = {}
    for instant in table.context.timeline.completed([Action.REPLACECOMMIT]):
        for partition in table.context.timeline.read_json(instant)["replaced"]:
            resizes[partition] = resizes.get(partition, 0) + 1
    assert {p: r.seq_no for p, r in rings(table).items()} == {p: resizes.get(p, 0) for p in rings(table)}


def check_all(table: mt.Table, model: TableModel) -> None:
    """Snapshot, placement and metadata of a partitioned table (its record index too: a resize moves keys)."""
    assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
    check_placement(table, True)
    check_metadata(table)
    assert stored(table, "record_index") == expected(table)["record_index"]


step_strategy = st.one_of(
    st.tuples(st.sampled_from(["upsert"] * 4 + ["delete"]), rows_strategy),
    st.tuples(st.sampled_from(["schedule_split", "schedule_merge", "run", "split", "merge", "compact", "clean"])),
)


@pytest.mark.slow
@settings(max_examples=20, deadline=None, phases=[Phase.generate, Phase.shrink])  # 30 examples: 41 s of the suite
@given(seed=st.lists(rows_strategy, min_size=2, max_size=3), steps=st.lists(step_strategy, min_size=3, max_size=12),
       table_type=st.sampled_from(["merge_on_read", "copy_on_write"]), partitioned=st.booleans())
def test_consistent_hashing_equals_the_model(seed, steps, table_type, partitioned):
    root = tempfile.mkdtemp(prefix="mt-ch-")
    try:
        table = create(f"{root}/t", table_type, partitioned)
        model = TableModel(partitioned)
        snapshots = []  # (write instant, the model after it)
        for step in [("upsert", batch) for batch in seed] + steps:
            kind = step[0]
            if kind in ("upsert", "delete"):
                pending = table.context.timeline.pending([Action.REPLACECOMMIT])
                data = pa.Table.from_pylist(step[1], schema=SCHEMA)
                written = getattr(table, kind)(data.select(["id", "p"]) if kind == "delete" else data).instant
                model.apply(kind, step[1])
                snapshots.append((written, model.expected()))
                event("write while a resize is pending" if pending else "write")
            elif kind.startswith("schedule"):
                done = with_options(table, GROW if kind.endswith("split") else SHRINK).schedule_clustering()
                event(f"{kind}: {'planned' if done else 'nothing'}")
            elif kind == "run":
                table.run_clustering()
            elif kind in ("split", "merge"):
                done = with_options(table, GROW if kind == "split" else SHRINK).cluster()
                event(f"{kind}: {'done' if done else 'nothing'}")
            elif kind == "compact":
                table.compact()
            else:
                table.clean()
            assert sort_rows(table.to_arrow().to_pylist()) == model.expected(), step
            check_placement(table, partitioned)
            check_seq_nos(table)
            check_metadata(table)
        table.run_clustering()
        assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
        check_placement(table, partitioned)
        check_metadata(table)
        check_history(table, snapshots, partitioned)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def check_history(table: mt.Table, snapshots: list[tuple[str, list[dict]]], partitioned: bool) -> None:
    """As of every write still readable, the model after it; and each write's change records take the
    snapshot before it to its own (a resize caught up what a write did while it was pending: the write's
    rows still belong to the write's instant)."""
    readable_from = table.context.view().readable_from
    before = None

    def identity(row: dict) -> tuple:
        return (row["p"], row["id"]) if partitioned else (row["id"],)

    for instant, model_rows in snapshots:
        if instant < readable_from:
            continue
        assert sort_rows(table.to_arrow(as_of=instant).to_pylist()) == model_rows, f"as of {instant}"
        if before is not None:
            assert applied(before[1], table.changes(before[0], instant), identity) == model_rows, \
                f"the changes of {instant}"
        before = (instant, model_rows)


def applied(start: list[dict], changes: pa.Table, identity: Callable[[dict], tuple]) -> list[dict]:
    """The rows as of a window's start with its change records applied: each pre-image or delete must be the
    row it removes, an insert must find none."""
    out = {identity(r): r for r in start}
    for change in changes.to_pylist():
        kind = change.pop("_change_type")
        del change["_commit_instant"], change["_commit_seq"]
        if kind in ("delete", "update_preimage"):
            assert out.pop(identity(change)) == change, kind
        else:
            assert kind == "update_postimage" or identity(change) not in out, kind
            out[identity(change)] = change
    return sort_rows(list(out.values()))


def batch(ids, p="a", v="v", ts=1) -> pa.Table:
    return pa.Table.from_pylist(rows(ids, p, v, ts), schema=SCHEMA)


def bucket_sizes(table: mt.Table, partition: str) -> list[int]:
    sizes = table.context.view().live_files[partition]
    return [sum(sizes.get(n, 0) for n in fs.file_names) for (p, _), fs in table.file_slices().items() if p == partition]


def test_initial_ring_is_written_with_the_first_commit(tmp_path):
    """RFC-42 test plan (1): initializing."""
    table = create(str(tmp_path / "t"), buckets=4)
    assert rings(table) == {}
    table.upsert(batch(range(100), "a"))
    ring = rings(table)["p=a"]
    assert ring.seq_no == 0 and ring.num_buckets == 4
    assert [n.value for n in ring.nodes] == [n.value for n in initial_ring("p=a", 4).nodes]
    assert {fid for (_, fid) in table.file_slices()} <= set(ring.file_ids)
    record = table.metadata.get("hashing_meta", hashing_meta_key("p=a"))
    assert record["num_buckets"] == 4 and record["instant"] == table.timeline()[-1].time
    table.upsert(batch(range(50, 150), "a"))
    assert rings(table)["p=a"].instant == record["instant"], "a later write keeps the ring"
    found = table.lookup(pa.table({"id": [1, 120, 999], "p": ["a", "a", "a"]}))
    assert found["file_id"].to_pylist()[2] is None and all(found["file_id"].to_pylist()[:2])


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_multiple_rounds_of_split_and_merge(tmp_path, table_type):
    """RFC-42 test plan (2)."""
    table = create(str(tmp_path / "t"), table_type, buckets=2)
    model = TableModel(True)
    grow = with_options(table, {"write.target_file_size": 3000, "bucket.split_threshold": 1.5,
                                "bucket.merge_threshold": 0.0})
    counts = []
    start = 0
    for round_, size in enumerate([500, 1200, 2500]):  # each round more than doubles the rows
        data = [{"id": i, "p": "a", "v": f"r{round_}-{(i * 2654435761) % 2**32:08x}", "ts": 1}
                for i in range(start, start + size)]
        start += size
        table.upsert(pa.Table.from_pylist(data, schema=SCHEMA))
        model.apply("upsert", data)
        assert grow.cluster() is not None
        counts.append(rings(table)["p=a"].num_buckets)
        assert max(bucket_sizes(table, "p=a")) <= 1.5 * 3000
        assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
    assert counts == sorted(counts) and counts[-1] > counts[0] > 2
    gone = rows(range(0, start - 60), "a", "x")
    table.delete(pa.Table.from_pylist(gone, schema=SCHEMA).select(["id", "p"]))
    model.apply("delete", gone)
    table.compact()  # merge-on-read: sizes count the logs until a compaction
    shrink = with_options(table, {"write.target_file_size": 3000, "bucket.merge_threshold": 0.9})
    assert shrink.cluster() is not None
    assert rings(table)["p=a"].num_buckets < counts[-1]
    assert rings(table)["p=a"].seq_no == 4
    check_all(table, model)
    # compaction and clean keep working; clean deletes the replaced file groups after retention
    for n in range(BASE["clean.retain_commits"] + 1):
        more = rows(range(5000 + n * 10, 5010 + n * 10), "a", "more")
        table.upsert(pa.Table.from_pylist(more, schema=SCHEMA))
        model.apply("upsert", more)
    table.compact()
    assert table.clean() is not None
    replaced = {file_id for _, file_id in table.context.view().replaced}
    on_disk = os.listdir(os.path.join(table.path, "p=a"))
    assert not {n for n in on_disk if any(n.lstrip(".").startswith(file_id) for file_id in replaced)}
    check_all(table, model)


def skewed_keys(n: int, below: int = 1 << 24) -> list[int]:
    """n ids whose key hashes all fall in [0, below): one bucket of any initial ring holds them all."""
    out: list[int] = []
    start = 0
    while len(out) < n:
        ids = np.arange(start, start + 200_000)
        hashes = hash32_array(pa.array([str(i) for i in ids]))
        out += ids[hashes < below].tolist()
        start += 200_000
    return out[:n]


def test_extreme_skew_converges_in_one_quantile_round(tmp_path, record_property):
    """RFC-42 test plan (3): most keys in a small hash range. quantile: every file group within the split
    threshold after ONE round; middle: the rounds it takes are reported."""
    ids = skewed_keys(3000)
    options = {"write.target_file_size": 8000, "bucket.split_threshold": 1.5, "bucket.merge_threshold": 0.0}
    rounds = {}
    for point in ("quantile", "middle"):
        table = create(str(tmp_path / point), buckets=4)
        table.upsert(pa.Table.from_pylist(rows(ids, "a", "skewed"), schema=SCHEMA))
        resizer = with_options(table, {**options, "bucket.split_point": point})
        n = 0
        while max(bucket_sizes(table, "p=a")) > 1.5 * 8000:
            assert resizer.cluster() is not None and n < 40
            n += 1
        rounds[point] = n
        assert table.to_arrow().num_rows == len(ids)
        check_placement(table, True)
    record_property("resize_rounds", json.dumps(rounds))
    print("rounds until every file group is within the split threshold:", rounds)
    assert rounds["quantile"] == 1
    assert rounds["middle"] > 3  # the two-way split halves a range: ~log2(size / target) rounds, and more


def test_schedule_refuses_what_a_resize_does_not_take(tmp_path):
    table = create(str(tmp_path / "t"))
    table.upsert(batch(range(10)))
    with pytest.raises(InvalidInputError, match="consistent-hashing"):
        table.schedule_clustering(sort_columns=["v"])
    with pytest.raises(InvalidInputError, match="consistent-hashing"):
        table.schedule_clustering(num_buckets=8)


def pending_resize(root: str, table_type: str = "merge_on_read", partitioned: bool = True, count: int = 600,
                   resize: dict = GROW) -> tuple[mt.Table, TableModel, str]:
    """A table with `count` rows and a resize planned on it (a split, or with SHRINK a merge)."""
    table = create(root, table_type, partitioned)
    model = TableModel(partitioned)
    first = rows(range(count), "a", "v0")
    table.upsert(pa.Table.from_pylist(first, schema=SCHEMA))
    model.apply("upsert", first)
    instant = with_options(table, resize).schedule_clustering()
    assert instant is not None
    return table, model, instant


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_writes_during_a_pending_resize_dual_write(lake, table_type):
    """Writes after the plan (dual writes: an upsert and a delete) commit before the resize: its catch-up
    adopts their dual logs. On both storages."""
    table, model, instant = pending_resize(lake / "t", table_type)
    during = rows(range(0, 700, 3), "a", "during", 2)
    table.upsert(pa.Table.from_pylist(during, schema=SCHEMA))
    model.apply("upsert", during)
    table.delete(batch(range(1, 60, 2)).select(["id", "p"]))
    model.apply("delete", rows(range(1, 60, 2), "a", ""))
    check_all(table, model)  # the old buckets serve reads meanwhile; the dual logs are not visible
    assert table.run_clustering() == [instant]
    check_all(table, model)
    # as of the resize, before the writes it caught up: their rows are not in it (each write's rows carry its
    # instant: logs on merge-on-read, a base of the child per write on copy-on-write)
    assert sort_rows(table.to_arrow(as_of=instant).to_pylist()) == sort_rows(rows(range(600), "a", "v0"))
    upserted = next(i.time for i in table.timeline() if i.time > instant)
    assert sort_rows(table.to_arrow(as_of=upserted).to_pylist()) == \
        sort_rows(list({r["id"]: r for r in [*rows(range(600), "a", "v0"), *during]}.values()))
    # and the window after it holds the writes: its records applied to that snapshot give the latest one
    assert applied(rows(range(600), "a", "v0"), table.changes(instant), lambda r: (r["id"],)) == \
        sort_rows(table.to_arrow().to_pylist())


def test_a_child_the_resize_wrote_no_base_for_keeps_later_writes_out_of_its_snapshot(tmp_path):
    """A merge-on-read split whose upper child gets no row of the old group (all its keys hash below the
    middle): a write during the pending resize dual-writes into that child. Its row is not in the snapshot as
    of the resize (the child's base carries the resize's instant: the adopted log must stay the write's),
    and the window after the resize reports it."""
    table = create(str(tmp_path / "t"), buckets=2)
    seed = rows(skewed_keys(300, below=1 << 24), "a", "v0")
    table.upsert(pa.Table.from_pylist(seed, schema=SCHEMA))
    instant = with_options(table, {**GROW, "bucket.split_point": "middle"}).schedule_clustering()
    assert instant is not None
    upper = [i for i in range(10_000, 20_000)
             if 0x20000000 < hash32_array(pa.array([str(i)]))[0].item() < 0x40000000][:5]
    assert len(upper) == 5  # above the split point (0x1FFFFFFF: the middle of the first node's range)
    later = rows(upper, "a", "later", 2)
    table.upsert(pa.Table.from_pylist(later, schema=SCHEMA))
    assert table.run_clustering() == [instant]
    model = TableModel(True)
    model.apply("upsert", seed)
    model.apply("upsert", later)
    check_all(table, model)
    assert sort_rows(table.to_arrow(as_of=instant).to_pylist()) == sort_rows(seed)
    inserted = table.changes(instant)
    assert sorted(inserted["id"].to_pylist()) == sorted(upper)
    assert set(inserted["_change_type"].to_pylist()) == {"insert"}


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_a_write_that_began_while_the_resize_was_pending_commits_after_it(lake, tmp_path, table_type):
    """The writer (another process) begins after the plan and is held before its commit while the resize
    commits: it adopts its own dual logs and drops its files of the replaced buckets. On both storages."""
    table, model, instant = pending_resize(lake / "t", table_type)
    late = rows(range(0, 700, 2), "a", "late", 5)
    go = tmp_path / "go"
    writer = act(table.path, "upsert", late, {**BASE, **LIVE}, **held_at("table.write.files", go))
    wait_held(writer, go)
    assert with_options(table, LIVE).run_clustering() == [instant]
    go.touch()
    code, out, err = finished(writer)
    assert code == 0, out + err
    model.apply("upsert", late)
    check_all(table, model)
    replaced = table.context.view().replaced
    assert not {(p, f) for (p, f) in table.file_slices()} & replaced


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_a_clean_keeps_the_files_a_retained_write_wrote_into_a_replaced_group(tmp_path, table_type):
    """A write that committed during a pending resize wrote its rows into the groups the resize replaces (the
    dual logs are the resize's copy). Once the resize completed, a clean whose retained instants hold that
    write but not the resize deleted those groups whole, and `changes()` of a window holding the write met a
    missing file (the chaos run's churn configuration). The retained instant between the two is a write to
    another partition, held before its commit until the resize completed."""
    table, model, instant = pending_resize(str(tmp_path / "t"), table_type)
    go = tmp_path / "go"
    other = rows(range(5), "b", "other", 3)
    writer = act(table.path, "upsert", other, {**BASE, **LIVE}, **held_at("table.write.files", go))
    wait_held(writer, go)
    during = rows(range(0, 600, 7), "a", "during", 2)
    written = table.upsert(pa.Table.from_pylist(during, schema=SCHEMA)).instant  # dual writes
    assert with_options(table, LIVE).run_clustering() == [instant]
    go.touch()
    code, out, err = finished(writer)
    assert code == 0, out + err
    start = next(i.time for i in table.timeline() if instant < i.time < written)  # the held write's instant
    cleaner = with_options(table, {"clean.retain_commits": 1})
    cleaner.clean()
    assert table.context.view().readable_from <= start
    changed = table.changes(start)  # it read the write's files in the replaced groups: no MissingFileError
    assert sorted(changed.filter(pc.equal(changed["p"], "a"))["id"].to_pylist()) == \
        sorted(2 * [r["id"] for r in during])  # each an update: its pre- and post-image
    model.apply("upsert", during)
    model.apply("upsert", other)
    check_all(table, model)
    assert mt.Table.open(table.path).fsck().healthy
    for ts in (4, 5):  # once the write is settled too, the replaced groups go whole
        table.upsert(pa.Table.from_pylist(rows(range(5), "b", "later", ts), schema=SCHEMA))
    assert cleaner.clean() is not None
    view = table.context.view()
    live = set()
    for p, names in view.live_files.items():
        bases, logs = parse_names(names, PARQUET)
        live |= {(p, f.file_id) for f in [*bases, *logs]}
    assert view.replaced and not live & view.replaced


def test_a_write_into_the_groups_a_merge_joins_gives_the_child_one_base(tmp_path):
    """Copy-on-write: a write during a pending merge into both groups it joins leaves a dual log from each; the
    catch-up applies them as one base of the child named by the write's instant (one per log gave the child
    two bases of one instant, and reads took either: the model test lost a row one run in three)."""
    table, model, instant = pending_resize(str(tmp_path / "t"), "copy_on_write", False, 40, SHRINK)
    during = rows(range(0, 60, 2), "a", "during", 2)
    written = table.upsert(pa.Table.from_pylist(during, schema=SCHEMA)).instant
    model.apply("upsert", during)
    assert table.run_clustering() == [instant]
    assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
    assert sort_rows(table.to_arrow(as_of=instant).to_pylist()) == sort_rows(rows(range(40), "a", "v0"))
    (child,) = table.file_slices()
    bases, _ = parse_names(os.listdir(table.path), PARQUET)
    assert sorted(b.instant for b in bases if b.file_id == child[1]) == [instant, written]
    check_placement(table, False)
    check_metadata(table)


def test_clean_keeps_what_a_pending_copy_on_write_resize_reads(tmp_path):
    """A copy-on-write resize reads the groups it replaces as of its plan (writes since rewrote them with
    their own rows): a clean while it is pending keeps that snapshot, however many writes came after."""
    table, model, instant = pending_resize(str(tmp_path / "t"), "copy_on_write")
    for ts in range(2, 6):
        during = rows(range(ts, 600, 5), "a", f"during{ts}", ts)
        table.upsert(pa.Table.from_pylist(during, schema=SCHEMA))
        model.apply("upsert", during)
    cleaner = with_options(table, {"clean.retain_commits": 1})
    assert cleaner.clean() is None, "nothing the resize reads is settled"
    assert table.run_clustering() == [instant]
    check_all(table, model)
    assert sort_rows(table.to_arrow(as_of=instant).to_pylist()) == sort_rows(rows(range(600), "a", "v0"))
    later = rows(range(5), "b", "later", 6)
    table.upsert(pa.Table.from_pylist(later, schema=SCHEMA))
    model.apply("upsert", later)
    assert cleaner.clean() is not None, "once it completed, the old slices go"
    check_all(table, model)


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_a_resize_killed_after_its_catch_up_leaves_none_of_its_files(tmp_path, table_type):
    """The files a catch-up writes carry the instants of the writes they came from, not the resize's (logs on
    merge-on-read, a base per write on copy-on-write), so no listing of the resize's instant finds them: its
    markers name them by path, and its rollback deletes them. Before, they stayed on disk, in no commit, for
    no clean to remove."""
    table, model, instant = pending_resize(str(tmp_path / "t"), table_type)
    during = rows(range(0, 700, 3), "a", "during", 2)
    table.upsert(pa.Table.from_pylist(during, schema=SCHEMA))
    model.apply("upsert", during)
    options = {**BASE, "heartbeat.interval_s": 0.1}
    code, out, err = finished(act(table.path, "cluster", [], options, METATABLE_CRASH_AT="table.commit.metadata"))
    assert code == -signal.SIGKILL, out + err
    time.sleep(0.5)  # its heartbeat expires
    fresh = with_options(table, options)
    fresh.context.transactions.recover()
    assert fresh.context.timeline.get(instant).state.value == "requested", "rolled back, its plan kept"
    live = {file_id for p, file_id in fresh.file_slices() if p == "p=a"}
    bases, logs = parse_names(os.listdir(os.path.join(table.path, "p=a")), PARQUET)
    assert {b.file_id for b in bases} <= live, "a base the catch-up wrote"
    assert not [f for f in logs if f.file_id not in live and "catchup" in f.write_token], "a log it adopted"
    assert {f.file_id for f in logs} - live, "the dual logs stay for the resize to adopt again"
    check_metadata(fresh)
    assert fresh.run_clustering() == [instant]
    check_all(fresh, model)
    assert sort_rows(fresh.to_arrow(as_of=instant).to_pylist()) == sort_rows(rows(range(600), "a", "v0"))


def test_two_resizes_racing_for_one_partition(tmp_path):
    """RFC-42 test plan (5): one wins; the other finds nothing to plan, or fails cleanly."""
    table = create(str(tmp_path / "t"))
    model = TableModel(True)
    data = rows(range(800), "a", "v0")
    table.upsert(pa.Table.from_pylist(data, schema=SCHEMA))
    model.apply("upsert", data)
    go = str(tmp_path / "go")
    racers = [act(table.path, "cluster", [], {**BASE, **GROW, **LIVE}, go=go) for _ in range(2)]
    release(racers, go)
    results = [finished(r) for r in racers]
    assert all(code in (0, 3) for code, _, _ in results), results
    completed = table.context.timeline.completed([Action.REPLACECOMMIT])
    # one wins; the other planned nothing, failed cleanly, or (had the first finished before it planned)
    # planned against the new ring: never two resizes of one ring
    planned_against = [ring["seq_no"] for i in completed for ring in table.context.timeline.plan(i)["rings"]]
    assert completed and sorted(planned_against) == list(range(len(completed))), results
    assert rings(table)["p=a"].seq_no == len(completed)
    assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
    check_metadata(table)


def test_a_resize_whose_ring_changed_since_planning_fails_cleanly_and_is_planned_again(tmp_path):
    """The plan records the seq_no it was planned against; a resize finding another ring is rolled back."""
    table, model, instant = pending_resize(str(tmp_path / "t"))
    requested = table.context.timeline.get(instant, Action.REPLACECOMMIT)
    record = table.context.timeline.plan(requested)
    record["rings"] = [{**ring, "seq_no": ring["seq_no"] + 7} for ring in record["rings"]]
    out = io.BytesIO()
    fastavro.writer(out, schema("clustering_plan"), [record])  # the plan of a ring that is no longer current
    path = os.path.join(table.context.timeline.dir, requested.file_name)
    table.context.storage.write_atomic(path, out.getvalue())
    with pytest.raises(ConflictError, match="changed since it was planned"):
        table.run_clustering(instant)
    assert table.context.timeline.get(instant) is None, "rolled back"
    assert rings(table)["p=a"].seq_no == 0
    check_all(table, model)
    assert with_options(table, GROW).cluster() is not None, "planned again, it succeeds"
    assert rings(table)["p=a"].seq_no == 1
    check_all(table, model)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["table.clustering.files", "metadata.write.log", "table.commit.metadata",
                                   "table.commit", "random"])
def test_sigkill_of_a_resize(tmp_path, point):
    table = create(str(tmp_path / "t"), options={"heartbeat.interval_s": 0.1})
    model = TableModel(True)
    for b in range(4):
        data = rows(range(b * 200, b * 200 + 300), "a", f"v{b}", b) + rows(range(b * 50, b * 50 + 100), "b", "w", b)
        table.upsert(pa.Table.from_pylist(data, schema=SCHEMA))
        model.apply("upsert", data)
    options = {**BASE, **GROW, "heartbeat.interval_s": 0.1}
    if point == "random":
        proc = act(table.path, "cluster", [], options)
        time.sleep(random.uniform(1.0, 3.0))
        proc.send_signal(signal.SIGKILL)
        finished(proc)
    else:
        code, out, err = finished(act(table.path, "cluster", [], options, METATABLE_CRASH_AT=point))
        assert code == -signal.SIGKILL, out + err
    time.sleep(0.5)  # its heartbeat expires
    fresh = with_options(table, GROW)
    assert sort_rows(fresh.to_arrow().to_pylist()) == model.expected()
    check_placement(fresh, True)
    fresh.run_clustering()  # resumes the interrupted resize
    assert not fresh.context.timeline.pending()
    assert sort_rows(fresh.to_arrow().to_pylist()) == model.expected()
    check_placement(fresh, True)
    check_seq_nos(fresh)
    check_metadata(fresh)
    more = rows(range(2000, 2600), "a", "more", 9)
    fresh.upsert(pa.Table.from_pylist(more, schema=SCHEMA))
    model.apply("upsert", more)
    assert fresh.cluster() is not None, "the next resize succeeds"
    assert sort_rows(fresh.to_arrow().to_pylist()) == model.expected()
    check_placement(fresh, True)


@pytest.mark.slow
@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_writers_and_readers_in_other_processes_during_resizes(tmp_path, table_type):
    """RFC-42 test plan (4): two writer processes upsert in a loop for the whole run while a third resizes
    over and over and a fourth reads: no writer fails, nothing is lost or duplicated, every read is a
    committed state (no key twice, no partition shrinking)."""
    root = str(tmp_path / "t")
    # clean keeps what the last 100 commits read: a snapshot read outlives a few commits (retention bounds the
    # longest read, as in Hudi and Delta)
    options = {**BASE, **LIVE, "clean.inline": True, "clean.retain_commits": 100}
    create(root, table_type, options=options)
    deadline = time.time() + 10
    journals = [str(tmp_path / f"journal-{i}") for i in range(4)]
    procs = [child("clustering_child", root, "write", journals[i], str(i), str(deadline), json.dumps(options))
             for i in range(2)]
    resizer = {**options, "write.target_file_size": 1500, "bucket.split_threshold": 1.0,
               "bucket.merge_threshold": 0.0}
    procs.append(child("clustering_child", root, "cluster", journals[2], "0", str(deadline), json.dumps(resizer)))
    procs.append(child("clustering_child", root, "read", journals[3], "0", str(deadline), json.dumps(options)))
    all_succeed(procs, timeout=240)
    table = mt.Table.open(root)
    model, rejected = model_of(table, journals[:2])
    assert not rejected
    resized = [json.loads(line) for line in open(journals[2])]
    assert sum(1 for r in resized if r.get("clustered")) >= 2, resized
    assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
    reads = [json.loads(line) for line in open(journals[3])]
    assert len(reads) >= 5 and all(r["ok"] for r in reads), [r for r in reads if not r["ok"]][:3]
    assert sum(r.seq_no for r in rings(table).values()) >= 2
    check_placement(table, True)
    check_metadata(table)


def test_a_resize_completing_while_a_reader_opens_its_view_is_not_half_seen(tmp_path, monkeypatch):
    """A view fixes the metadata table's snapshot, then lists the timeline: a resize completing in between
    must not count as completed (it would hide the parent file groups while the snapshot does not yet hold
    the children's files, and the read would lose rows). Found as a flaky multi-process read."""
    table = create(str(tmp_path / "t"))
    for n in range(3):
        table.upsert(batch(range(n * 100, n * 100 + 100), "a", f"v{n}"))
    before = sort_rows(table.to_arrow().to_pylist())
    reader = mt.Table.open(table.path)
    refresh = MetadataTable.refresh
    armed = [True]

    def refresh_then_resize(metadata: MetadataTable) -> None:
        refresh(metadata)
        if armed[0] and metadata is reader.metadata:
            armed[0] = False
            assert with_options(table, GROW).cluster() is not None

    monkeypatch.setattr(MetadataTable, "refresh", refresh_then_resize)
    assert sort_rows(reader.to_arrow().to_pylist()) == before
    assert not armed[0], "the resize ran inside the reader's view"
    monkeypatch.undo()
    assert sort_rows(mt.Table.open(table.path).to_arrow().to_pylist()) == before
