"""The async indexer (RFC-45) and the record index: scenarios with writers in separate processes, SIGKILL of
the indexer, and a model test of the record index.

After each scenario the built partitions are compared with ground truth computed here from the file slices
(every live base file's bloom filter and column stats, every live key's record-index entry, nothing else),
with the same partitions built from scratch on a copy of the table, and lookups with where keys really are.
"""
from __future__ import annotations

import json
import os
import random
import signal
import threading
import time

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metatable as mt
from indexes.bloom import BloomFilter
from indexes.column_stats import file_column_stats
from indexes.keys import bloom_filter_key, record_index_key

from metatable.errors import IndexingAborted, InvalidInputError
from metatable.file_group.slice_reader import read_slice
from metatable.services.index_build import merge_sorted
from metatable.table_config import KEY_COLUMN
from metatable.timeline.instant import Action

from .table_model import SCHEMA, copy_table, read_parquet
from .test_write_concurrency import act, child, finished, rows

ALL = ["bloom_filter", "column_stats", "record_index"]
# every process judges heartbeats alike: 2 s without a beat is a dead process
OPTIONS = {"heartbeat.interval_s": 0.2, "heartbeat.tolerable_misses": 10, "clean.retain_commits": 50}


def make(root: str, metadata_indexes=(), table_type="merge_on_read", index=None) -> mt.Table:
    table = mt.Table.create(root, SCHEMA, "id", partition_by="p", ordering_field="ts", table_type=table_type,
                            index=index or mt.IndexConfig(num_buckets=2), metadata_indexes=list(metadata_indexes),
                            options=OPTIONS)
    for p in ("p0", "p1"):
        table.upsert(pa.Table.from_pylist(rows(range(300), p, "seed"), schema=SCHEMA))
    return table


def indexer(root: str, action: str, *args: str, **env: str):
    return child("indexer_child", root, action, json.dumps(OPTIONS), *args, **env)


def writer(root: str, seed: int, seconds: float):
    return indexer(root, "write", str(seed), str(time.time() + seconds))


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def pending(table: mt.Table, action: Action) -> list:
    return table.context.timeline.pending([action])


def held_writer(table: mt.Table, ids, p: str, v: str, ts: int, seconds: int):
    """An upsert in another process, held `seconds` before its commit; returns once it is inflight."""
    proc = act(table.path, "upsert", rows(ids, p, v, ts), OPTIONS, METATABLE_PAUSE_AT=f"table.write.files:{seconds}")
    wait_for(lambda: pending(table, Action.DELTACOMMIT))
    return proc


def succeeded(proc, timeout: float = 120) -> str:
    code, out, err = finished(proc, timeout)
    assert code == 0, err
    return out


# -- ground truth ---------------------------------------------------------------------------------------
def expected(table: mt.Table) -> dict[str, dict]:
    """What the indexes must hold, from the file slices themselves."""
    config = table.config
    unique = config.keys_unique_across_partitions
    out: dict[str, dict] = {"bloom_filter": {}, "column_stats": {}, "record_index": {}}
    for (partition, file_id), fs in table.file_slices().items():
        if fs.base:
            data, footer = read_parquet(table, table.context.paths.file(partition, fs.base.file_name))
            stats = file_column_stats(data, config.stats_columns(), partition, fs.base.file_name, footer)
            out["column_stats"].update({k: {f: v for f, v in r.items() if f != "resets"} for k, r in stats.items()})
            bloom = BloomFilter.build(data[KEY_COLUMN], config.options["index.bloom.fpp"]).to_bytes()
            out["bloom_filter"][bloom_filter_key(partition, fs.base.file_name)] = bloom
        live = read_slice(table.storage, table.context.paths, config, fs)[KEY_COLUMN].to_pylist()
        out["record_index"].update({record_index_key(partition, k, unique): (partition, file_id) for k in live})
    return out


def stored(table: mt.Table, partition: str) -> dict:
    records = dict(table.metadata.scan(partition))
    if partition == "bloom_filter":
        return {k: r["bloom_filter"] for k, r in records.items()}
    if partition == "record_index":
        return {k: (r["partition_path"], r["file_id"]) for k, r in records.items()}
    return records


def check_indexes(root: str, partitions=ALL) -> mt.Table:
    """The partitions are ready and hold exactly the ground truth; lookups and gets find every key."""
    table = mt.Table.open(root, options=OPTIONS)
    assert {p: table.indexes()[p] for p in partitions} == dict.fromkeys(partitions, "ready")
    truth = expected(table)
    for partition in partitions:
        assert stored(table, partition) == truth[partition], partition
    data = table.to_arrow()
    keys = data.select(["id", "p"]).append_column("absent", pa.array([False] * data.num_rows))
    absent = pa.table({"id": pa.array([10_000, 10_001], pa.int64()), "p": ["p0", "p1"],
                       "absent": [True, True]})
    probe = pa.concat_tables([keys, absent])
    found = table.lookup(probe.select(["id", "p"]))
    holders = {(partition, key): file_id for (partition, file_id), fs in table.file_slices().items()
               for key in read_slice(table.storage, table.context.paths, table.config, fs)[KEY_COLUMN].to_pylist()}
    want = [holders.get((f"p={p}", str(i))) for i, p in zip(probe["id"].to_pylist(), probe["p"].to_pylist())]
    assert found["file_id"].to_pylist() == want  # each key in the file group that holds it, absent ones nowhere
    assert found["file_id"].null_count == 2
    if "record_index" in partitions:
        assert table.lookup(probe.select(["id", "p"]), explain=True)[1]["index"] == "record_index"
        got = table.get(keys.select(["id", "p"]))
        assert sorted(got["id"].to_pylist()) == sorted(data["id"].to_pylist())
    return table


def built_from_scratch_equal(root: str, tmp_path, partitions=ALL) -> None:
    """The partitions equal the same partitions built on a copy of the table with nothing running."""
    copy = f"{root}-scratch-{time.time_ns()}"
    copy_table(root, copy)
    scratch = mt.Table.open(copy, options=OPTIONS)
    for partition in partitions:
        scratch.drop_index(partition)
    scratch.schedule_indexing(partitions)
    scratch.run_indexing()
    original = mt.Table.open(root, options=OPTIONS)
    for partition in partitions:
        assert stored(original, partition) == stored(scratch, partition), partition


def check_all(root: str, tmp_path, partitions=ALL) -> mt.Table:
    table = check_indexes(root, partitions)
    built_from_scratch_equal(root, tmp_path, partitions)
    return table


def last_indexing(table: mt.Table) -> dict:
    done = [i for i in table.timeline() if i.action is Action.INDEXING and i.is_completed]
    return table.context.timeline.read_json(done[-1])


# -- the API and its errors --------------------------------------------------------------------------------
def test_index_an_existing_table(tmp_path):
    table = make(str(tmp_path / "t"), ["column_stats"])
    table.delete(pa.table({"id": pa.array([1, 2], pa.int64()), "p": ["p0", "p0"]}))
    instant = table.schedule_indexing(["bloom_filter", "record_index"])
    assert table.indexes() == {"column_stats": "ready", "bloom_filter": "building", "record_index": "building"}
    assert table.lookup(pa.table({"id": pa.array([3], pa.int64())}), explain=True)[1]["index"] == "bucket"
    assert table.run_indexing() == [instant]
    check_all(table.path, tmp_path, ALL)
    status = {row["partition"]: row for row in table.index_status()}
    assert status["record_index"]["records"] == 598 and status["record_index"]["state"] == "ready"
    assert status["record_index"]["current_to"] == max(i.time for i in table.timeline() if i.is_completed)
    assert last_indexing(table)["caught_up_to"] is not None


def test_refusals(tmp_path):
    table = make(str(tmp_path / "t"), ["column_stats"])
    with pytest.raises(InvalidInputError, match="column_stats is ready"):
        table.schedule_indexing(["column_stats"])
    with pytest.raises(InvalidInputError, match="builds"):
        table.schedule_indexing(["files"])
    table.schedule_indexing(["record_index"])
    with pytest.raises(InvalidInputError, match="record_index is building"):
        table.schedule_indexing(["record_index", "bloom_filter"])
    with pytest.raises(InvalidInputError, match="no index 'bloom_filter'"):
        table.drop_index("bloom_filter")
    bloom = mt.Table.create(str(tmp_path / "b"), SCHEMA, "id", index=mt.IndexConfig(type="bloom"),
                            metadata_indexes=["bloom_filter", "column_stats"])
    with pytest.raises(InvalidInputError, match="needs it"):
        bloom.drop_index("bloom_filter")


def test_writes_maintain_building_and_ready_partitions_whatever_their_options(tmp_path):
    """A table object opened before the schedule writes the new partitions: the states decide, not the
    writer's config (HUDI-5769)."""
    table = make(str(tmp_path / "t"))
    stale = mt.Table.open(table.path, options=OPTIONS)
    table.schedule_indexing(["record_index"])
    result = stale.upsert(pa.Table.from_pylist(rows(range(290, 320), "p0", "late", 2), schema=SCHEMA))
    assert "record_index" in table.context.timeline.read_json(
        table.context.timeline.get(result.instant))["indexes"]
    table.run_indexing()
    assert last_indexing(table)["applied"] == []
    check_all(table.path, tmp_path, ["record_index"])


def test_record_index_type_tags_through_the_record_index(tmp_path):
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", partition_by="p", ordering_field="ts",
                            index=mt.IndexConfig(type="record"), options=OPTIONS)
    assert table.indexes() == {"column_stats": "ready", "record_index": "ready"}
    table.upsert(pa.Table.from_pylist(rows(range(100), "p0", "a"), schema=SCHEMA))
    table.upsert(pa.Table.from_pylist(rows(range(50, 150), "p0", "b", 2), schema=SCHEMA))
    table.delete(pa.table({"id": pa.array([0, 1], pa.int64()), "p": ["p0", "p0"]}))
    assert table.to_arrow().num_rows == 148
    check_indexes(table.path, ["column_stats", "record_index"])


# -- scenarios -----------------------------------------------------------------------------------------
def commits_by_writer(table: mt.Table, after: str, written: dict[str, list[str]]) -> dict[int, int]:
    """How many deltacommits each `write` child (seed 0 writes p0, seed 1 p1) completed after `after`;
    `written` keeps the file groups of the commits already read (one read of each, however often polled)."""
    timeline = table.context.timeline
    counts = {0: 0, 1: 0}
    for instant in timeline.completed([Action.DELTACOMMIT]):
        if instant.time > after:
            if instant.time not in written:
                written[instant.time] = timeline.read_json(instant)["file_groups"]
            for seed in counts:
                counts[seed] += any(g.startswith(f"p=p{seed}/") for g in written[instant.time])
    return counts


@pytest.mark.slow
def test_a_writers_upsert_for_the_whole_indexing(lake, tmp_path, monkeypatch):
    """On both storages. Each writer's own commits are counted: a fresh-clone run whose second writer started
    late (its imports beside a loaded worker) met a wait on both writers' total with one writer alone."""
    root = lake / "t"
    seeded = make(root).timeline()[-1].time
    stop = str(tmp_path / "stop")  # the writers write until the indexing is done, however slow the machine
    writers = [indexer(root, "write", str(seed), stop) for seed in (0, 1)]
    observer = mt.Table.open(root)
    written: dict[str, list[str]] = {}
    wait_for(lambda: min(commits_by_writer(observer, seeded, written).values()) >= 2, timeout=120)  # both under way
    go = tmp_path / "go"  # this process's indexer is held after its build until each writer committed 4 times
    monkeypatch.setenv("METATABLE_PAUSE_AT", f"indexer.built:{go}")  # (1 s was too short beside a loaded worker)
    table = mt.Table.open(root, options=OPTIONS)
    indexing = table.schedule_indexing(ALL)

    def release() -> None:
        try:
            wait_for(lambda: min(commits_by_writer(observer, indexing, written).values()) >= 4, timeout=120)
        finally:
            go.touch()

    releaser = threading.Thread(target=release, daemon=True)  # only lets the indexer go on
    releaser.start()
    table.run_indexing()
    releaser.join()
    open(stop, "w").close()
    assert all(json.loads(succeeded(w)) >= 6 for w in writers)  # 2 before the schedule, 4 after it
    timeline = table.context.timeline
    caught_up = last_indexing(table)["caught_up_to"]
    during = [i for i in timeline.completed([Action.DELTACOMMIT]) if indexing < i.time <= caught_up]
    assert during and all(timeline.read_json(i)["indexes"] == sorted(ALL) for i in during)  # they wrote them
    check_all(root, tmp_path)


@pytest.mark.slow
def test_b_a_missed_write_is_applied_and_an_earlier_one_waited_for(tmp_path):
    """W1 began before the schedule and commits after execution began; W2 began after W1 and completed
    before the schedule, so t is before both and W2 did not write the new partitions: catch-up applies it."""
    root = str(tmp_path / "t")
    table = make(root)
    w1 = held_writer(table, range(250, 350), "p0", "w1", 2, 3)
    w2 = table.upsert(pa.Table.from_pylist(rows(range(0, 40), "p1", "w2", 2), schema=SCHEMA))
    table.delete(pa.table({"id": pa.array([5, 6], pa.int64()), "p": ["p1", "p1"]}))
    table.schedule_indexing(ALL)
    table.run_indexing()
    assert w2.instant in last_indexing(table)["applied"]
    assert finished(w1)[0] == 0
    check_all(root, tmp_path)


@pytest.mark.slow
def test_c_a_write_finishes_last_after_the_bases_are_built(tmp_path):
    root = str(tmp_path / "t")
    table = make(root)
    w1 = held_writer(table, range(0, 100), "p1", "w1", 3, 5)
    run = indexer(root, "schedule_run", *ALL, METATABLE_PAUSE_AT="indexer.built:2")
    wait_for(lambda: pending(table, Action.INDEXING))
    table.upsert(pa.Table.from_pylist(rows(range(280, 330), "p0", "during", 2), schema=SCHEMA))
    table.delete(pa.table({"id": pa.array([7, 8], pa.int64()), "p": ["p0", "p0"]}))
    succeeded(run)
    code, out, _ = finished(w1)
    assert code == 0
    w1_instant = json.loads(out)["instant"]
    assert table.context.timeline.read_json(table.context.timeline.get(w1_instant))["indexes"] == sorted(ALL)
    assert last_indexing(table)["caught_up_to"] >= w1_instant  # the indexer waited for it
    check_all(root, tmp_path)


@pytest.mark.slow
def test_d_a_write_still_running_at_the_timeout_aborts_and_a_retry_succeeds(tmp_path):
    root = str(tmp_path / "t")
    table = make(root)
    w1 = held_writer(table, range(0, 50), "p0", "slow", 2, 6)
    impatient = mt.Table.open(root, options={**OPTIONS, "indexer.catchup_timeout_s": 1.0})
    impatient.schedule_indexing(["record_index", "bloom_filter"])
    with pytest.raises(IndexingAborted, match="still running"):
        impatient.run_indexing()
    assert impatient.indexes() == {}
    assert "record_index" not in impatient.metadata.partitions
    assert not os.listdir(os.path.join(impatient.metadata.root, "record_index"))
    assert finished(w1)[0] == 0
    impatient.schedule_indexing(["record_index", "bloom_filter"])
    impatient.run_indexing()
    check_all(root, tmp_path, ["record_index", "bloom_filter"])


def test_e_scheduled_then_dropped_before_running(tmp_path):
    root = str(tmp_path / "t")
    table = make(root, ["column_stats"])
    instant = table.schedule_indexing(["record_index", "bloom_filter"])
    assert table.drop_index("record_index") == [instant]
    assert table.indexes() == {"column_stats": "ready"}  # the cancelled indexing's other partition went too
    assert not pending(table, Action.INDEXING)
    assert {"record_index", "bloom_filter"}.isdisjoint(table.metadata.partitions)
    table.upsert(pa.Table.from_pylist(rows(range(10), "p0", "after"), schema=SCHEMA))
    assert table.run_indexing() == []
    table.schedule_indexing(["record_index"])
    table.run_indexing()
    check_all(root, tmp_path, ["record_index", "column_stats"])


def test_e_rebuilt_after_a_drop_while_a_write_is_inflight(tmp_path):
    """The rebuild of a dropped index, scheduled while a write that began before is inflight: its build is as
    of the instant before that write (`up_to`). A write that completed after that instant, before the drop,
    wrote only the dropped index, which is gone: it is caught up all the same. The chaos run read a rebuilt
    record index without such writes' keys."""
    root = str(tmp_path / "t")
    table = make(root, ["record_index"])
    held = held_writer(table, range(1000, 1010), "p0", "held", 2, seconds=3)  # inflight: up_to stops before it
    table.upsert(pa.Table.from_pylist(rows(range(2000, 2010), "p1", "before the drop"), schema=SCHEMA))
    table.drop_index("record_index")
    table.schedule_indexing(["record_index"])
    succeeded(held)
    table.run_indexing()
    check_indexes(root, ["record_index"])


@pytest.mark.slow
def test_f_dropped_while_writers_write(tmp_path):
    root = str(tmp_path / "t")
    table = make(root)
    table.schedule_indexing(ALL)
    table.run_indexing()
    stop = str(tmp_path / "stop")  # each drop comes after both writers committed twice more
    writers = [indexer(root, "write", str(seed), stop) for seed in (0, 1)]
    written: dict[str, list[str]] = {}
    for drop in ("record_index", "bloom_filter", None):
        since = table.timeline()[-1].time
        wait_for(lambda: min(commits_by_writer(table, since, written).values()) >= 2, timeout=120)
        if drop:
            table.drop_index(drop)
    open(stop, "w").close()
    assert all(json.loads(succeeded(w)) >= 6 for w in writers)
    table = mt.Table.open(root, options=OPTIONS)
    assert table.indexes() == {"column_stats": "ready"}
    assert not os.path.exists(os.path.join(table.metadata.root, "record_index")) or \
        not os.listdir(os.path.join(table.metadata.root, "record_index"))
    last = table.context.timeline.read_json(table.context.timeline.completed()[-1])
    assert last.get("indexes") == ["column_stats"]
    check_all(root, tmp_path, ["column_stats"])


@pytest.mark.slow
def test_g_a_compaction_and_a_clustering_complete_during_the_indexing(tmp_path):
    """Some complete before the schedule but after t (applied by catch-up), some while it builds (they write
    the partitions themselves)."""
    root = str(tmp_path / "t")
    table = make(root)
    table.upsert(pa.Table.from_pylist(rows(range(0, 200, 2), "p0", "log", 2), schema=SCHEMA))
    w1 = held_writer(table, range(0, 30), "p1", "w1", 3, 4)
    compacted = table.compact()
    clustered = table.cluster(sort_columns=["v"], partitions=["p=p0"])
    assert compacted and clustered
    run = indexer(root, "schedule_run", *ALL, METATABLE_PAUSE_AT="indexer.built:2")
    wait_for(lambda: pending(table, Action.INDEXING))
    table.upsert(pa.Table.from_pylist(rows(range(100, 160), "p0", "during", 3), schema=SCHEMA))
    during = table.compact()
    succeeded(run)
    assert finished(w1)[0] == 0
    applied = last_indexing(table)["applied"]
    assert compacted in applied and clustered in applied and during not in applied
    check_all(root, tmp_path)


# -- crashes -----------------------------------------------------------------------------------------------
def crashed_at(root: str, point: str, nth: int = 1) -> None:
    """A missed write to catch up (W1 held, W2 completed), an indexer SIGKILLed at `point`, then a run in
    this process that finishes the indexing."""
    table = mt.Table.open(root, options=OPTIONS)
    w1 = held_writer(table, range(250, 300), "p0", "w1", 2, 3)
    table.upsert(pa.Table.from_pylist(rows(range(0, 40), "p1", "w2", 2), schema=SCHEMA))
    killed = indexer(root, "schedule_run", *ALL, METATABLE_CRASH_AT=f"{point}:{nth}")
    assert finished(killed)[0] == -signal.SIGKILL
    assert finished(w1)[0] == 0
    time.sleep(2.5)  # the dead indexer's heartbeat expires
    table = mt.Table.open(root, options=OPTIONS)
    if not pending(table, Action.INDEXING) and table.indexes().get("record_index") is None:
        table.schedule_indexing(ALL)  # killed before its plan existed
    table.run_indexing()


@pytest.mark.slow
@pytest.mark.parametrize("point", ["indexer.requested", "indexer.build.file_group", "indexer.catch_up",
                                   "indexer.ready"])
def test_sigkill_at_named_points(tmp_path, point):
    root = str(tmp_path / "t")
    make(root)
    writers = [writer(root, seed, 6) for seed in (0, 1)]
    crashed_at(root, point, 2 if point == "indexer.build.file_group" else 1)
    assert all(json.loads(succeeded(w)) > 0 for w in writers)
    check_all(root, tmp_path)


def test_a_schedule_after_one_that_died_before_its_states_replaces_it(tmp_path):
    """An indexer SIGKILLed between its plan and the partitions' states leaves a pending indexing while
    `indexes()` shows none; a new schedule (what a user, or the chaos benchmark, does then) rolls the old one
    back instead of leaving two pending indexings of one partition, which writers and the build disagreed on
    (a chaos run read a ready record index without the older one's bases)."""
    root = str(tmp_path / "t")
    make(root)
    table = mt.Table.open(root, options=OPTIONS)
    killed = indexer(root, "schedule", *ALL, METATABLE_CRASH_AT="indexer.requested")
    assert finished(killed)[0] == -signal.SIGKILL
    (dead,) = pending(table, Action.INDEXING)
    assert table.indexes().get("record_index") is None
    table.upsert(pa.Table.from_pylist(rows(range(0, 40), "p1", "w2", 2), schema=SCHEMA))
    scheduled = table.schedule_indexing(ALL)
    assert [i.time for i in pending(table, Action.INDEXING)] == [scheduled] != [dead.time]
    table.upsert(pa.Table.from_pylist(rows(range(20, 60), "p1", "w3", 3), schema=SCHEMA))
    assert table.run_indexing() == [scheduled]
    check_all(root, tmp_path)


@pytest.mark.slow
def test_sigkill_at_random_moments(tmp_path):
    rng = random.Random(7)
    for attempt in range(3):
        root = str(tmp_path / f"t{attempt}")
        make(root)
        proc = indexer(root, "schedule_run", *ALL)
        time.sleep(rng.uniform(0.3, 2.0))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        time.sleep(2.5)
        table = mt.Table.open(root, options=OPTIONS)
        if table.indexes().get("record_index") is None:
            table.schedule_indexing(ALL)
        table.run_indexing()
        check_all(root, tmp_path)


# -- the record index against a model ----------------------------------------------------------------------
ops = st.lists(st.one_of(
    st.tuples(st.just("upsert"), st.lists(st.tuples(st.integers(0, 30), st.sampled_from(["a", "b"])), min_size=1,
                                          max_size=12)),
    st.tuples(st.just("delete"), st.lists(st.integers(0, 30), min_size=1, max_size=6)),
    st.tuples(st.sampled_from(["compact", "cluster", "clean"]), st.none())), min_size=1, max_size=10)


@settings(max_examples=25)
@given(ops=ops, table_type=st.sampled_from(["merge_on_read", "copy_on_write"]))
def test_record_index_equals_a_dict_model(tmp_path_factory, ops, table_type):
    """Global scope: an upsert naming another partition moves the key there (deleted where it was), a
    delete removes it wherever it is."""
    root = str(tmp_path_factory.mktemp("ri") / "t")
    table = mt.Table.create(root, SCHEMA, "id", partition_by="p", ordering_field="ts", table_type=table_type,
                            index=mt.IndexConfig(type="record", scope="global"),
                            options={"clean.retain_commits": 1, "write.target_file_size": 4096})
    model: dict[str, str] = {}
    for step, (op, arg) in enumerate(ops):
        if op == "upsert":
            batch = {i: p for i, p in arg}
            table.upsert(pa.Table.from_pylist([{"id": i, "p": p, "v": str(step), "ts": step} for i, p in batch.items()],
                                              schema=SCHEMA))
            for i, p in batch.items():
                model[str(i)] = f"p={p}"
        elif op == "delete":
            table.delete(pa.table({"id": pa.array(arg, pa.int64()), "p": ["a"] * len(arg)}))
            for i in arg:
                model.pop(str(i), None)
        elif op == "compact" and table_type == "merge_on_read":
            table.compact()
        elif op == "cluster":
            table.cluster()
        elif op == "clean":
            table.clean()
    index = stored(table, "record_index")
    assert {k: p for k, (p, _) in index.items()} == model
    assert index == expected(table)["record_index"]


def test_the_build_on_spark_equals_the_build_in_process(tmp_path, spark):
    """One Spark task per data file group, one writer per metadata file group: the same bases."""
    root = str(tmp_path / "t")
    table = make(root)
    table.upsert(pa.Table.from_pylist(rows(range(0, 300, 3), "p1", "log", 2), schema=SCHEMA))
    table.delete(pa.table({"id": pa.array([4, 5], pa.int64()), "p": ["p0", "p0"]}))
    copy = str(tmp_path / "copy")
    copy_table(root, copy)
    for path, session in ((root, spark), (copy, None)):
        t = mt.Table.open(path, options=OPTIONS)
        t.schedule_indexing(ALL)
        t.run_indexing(spark=session)
    check_indexes(root)
    for partition in ALL:
        assert stored(mt.Table.open(root), partition) == stored(mt.Table.open(copy), partition)


keys_ = st.lists(st.text(alphabet="ab\x00é\U0001f600", max_size=4), max_size=60)


@given(runs=st.lists(keys_, max_size=5), size=st.integers(1, 9))
def test_merged_runs_are_sorted_as_rocksdb_compares(runs, size):
    """`merge_sorted` against Python's sort by UTF-8 bytes (RocksDB's order), repeated keys kept."""
    def batches(keys: list[str]):
        table = pa.table({"key": pa.array(sorted(keys, key=str.encode), pa.string()),
                          "value": pa.array([k.encode() for k in sorted(keys, key=str.encode)], pa.binary())})
        return iter(table.to_batches(max_chunksize=size))
    merged = [c for chunk in merge_sorted([batches(keys) for keys in runs]) for c in chunk["key"].to_pylist()]
    assert merged == sorted((k for keys in runs for k in keys), key=str.encode)


def test_merged_runs_fixed_vector():
    run = lambda *keys: iter(pa.table({"key": list(keys), "value": [b""] * len(keys)}).to_batches(max_chunksize=2))
    chunks = list(merge_sorted([run("a", "c", "e"), run("b", "b", "z"), run()]))
    assert [k for c in chunks for k in c["key"].to_pylist()] == ["a", "b", "b", "c", "e", "z"]
