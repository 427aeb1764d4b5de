"""Clustering through the public API, with real processes where concurrency or crashes are the point."""
from __future__ import annotations

import json
import os
import random
import signal
import time

import pyarrow as pa
import pytest

import metatable as mt
from indexes.arrow_keys import bucket_ids
from indexes.bucket import bucket_of

from metatable.errors import ClusteringConflict, ConflictError, InvalidInputError
from metatable.file_group.base_file import BaseFile
from metatable.file_group.slice_reader import read_slice
from metatable.table_config import KEY_COLUMN
from metatable.timeline.instant import DATA_ACTIONS, Action

from .table_model import SCHEMA, TableModel, check_metadata, sort_rows
from .test_write_concurrency import act, all_succeed, child, finished, held_at, rows, wait_held

SMALL = {"write.target_file_size": 4096, "clustering.small_file_limit": 1 << 20, "clean.inline": False,
         "heartbeat.interval_s": 0.1, "heartbeat.tolerable_misses": 3}


def loaded(root: str, table_type: str = "merge_on_read", index: str = "bloom", batches: int = 6,
           options: dict | None = None, buckets: int = 2) -> tuple[mt.Table, TableModel]:
    table = mt.Table.create(root, SCHEMA, "id", "p", "ts", table_type=table_type,
                            index=mt.IndexConfig(type=index, num_buckets=buckets),
                            metadata_indexes=["column_stats", "bloom_filter"], options={**SMALL, **(options or {})})
    model = TableModel(True)
    for b in range(batches):
        batch = rows(range(b * 40, b * 40 + 60), "a", f"v{b}", b) + rows(range(b * 10, b * 10 + 20), "b", f"v{b}", b)
        table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
        model.apply("upsert", batch)
    return table, model


def reopened(table: mt.Table, **options) -> mt.Table:
    """The loaded table (many small file groups), opened with file groups to cluster into 1 MB."""
    return mt.Table.open(table.path, options={"write.target_file_size": 1 << 20, **options})


def snapshot(table: mt.Table) -> list[dict]:
    return sort_rows(table.to_arrow().to_pylist())


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_cluster_replaces_small_file_groups_and_time_travel_reads_the_old_ones(lake, table_type):
    table, model = loaded(lake / "t", table_type)
    table = mt.Table.open(table.path, options={"write.target_file_size": 1 << 20})
    before = table.file_slices()
    last_write = table.timeline()[-1].time
    instant = table.cluster(sort_columns=["v"])
    after = table.file_slices()
    assert instant and len(after) < len(before)
    assert not set(after) & set(before), "every file group was rewritten under a new id"
    assert snapshot(table) == model.expected()
    assert sort_rows(table.to_arrow(as_of=last_write).to_pylist()) == model.expected()
    assert set(table.file_slices(as_of=last_write)) == set(before)
    meta = table.context.timeline.read_json(table.context.timeline.get(instant, Action.REPLACECOMMIT))
    assert {(p, f) for p, ids in meta["replaced"].items() for f in ids} == set(before)
    check_metadata(table)
    assert table.cluster() is None, "nothing small is left to merge"


def test_clean_deletes_replaced_file_groups_once_no_retained_instant_reads_them(tmp_path):
    table, model = loaded(str(tmp_path / "t"), "copy_on_write", options={"clean.retain_commits": 2})
    table = mt.Table.open(table.path, options={"write.target_file_size": 1 << 20})
    instant = table.cluster()
    assert instant is not None
    meta = table.context.timeline.read_json(table.context.timeline.get(instant, Action.REPLACECOMMIT))
    replaced = {(p, f) for p, ids in meta["replaced"].items() for f in ids}

    def ids_on_disk() -> set[tuple[str, str]]:
        return {(p, n.split("_")[0]) for p, names in table.context.view().live_files.items() for n in names}

    table.clean()
    assert replaced <= ids_on_disk(), "a retained instant still reads the replaced groups"
    for v in range(2):
        batch = rows(range(500 + v, 501 + v), "a", "late", 9)
        table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
        model.apply("upsert", batch)
    assert table.clean() is not None
    assert not replaced & ids_on_disk()
    assert snapshot(table) == model.expected()
    check_metadata(table)


def test_inline_clustering_runs_every_n_commits(tmp_path):
    table, model = loaded(str(tmp_path / "t"), "copy_on_write", batches=1,
                          options={"clustering.inline_every": 3, "clustering.sort_columns": "v"})
    for b in range(1, 7):
        batch = rows(range(b * 40, b * 40 + 60), "a", f"v{b}", b)
        table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
        model.apply("upsert", batch)
    replacecommits = [i for i in table.timeline() if i.action is Action.REPLACECOMMIT and i.is_completed]
    assert len(replacecommits) == 2
    assert snapshot(table) == model.expected()


def test_schedule_validates_its_arguments(tmp_path):
    table, _ = loaded(str(tmp_path / "t"), batches=2)
    with pytest.raises(InvalidInputError, match="nope"):
        table.schedule_clustering(sort_columns=["nope"])
    with pytest.raises(InvalidInputError, match="p=zz"):
        table.schedule_clustering(partitions=["p=zz"])
    with pytest.raises(InvalidInputError, match="bloom index"):
        table.cluster(num_buckets=4)
    with pytest.raises(InvalidInputError, match="no pending clustering"):
        table.run_clustering("20200101000000000")


def test_partitions_and_recent(tmp_path):
    table, model = loaded(str(tmp_path / "t"))
    table = reopened(table)
    instant = table.schedule_clustering(sort_columns=["v"], partitions=["p=b"])
    plan = table.context.timeline.plan(table.context.timeline.get(instant))
    assert {g["partition"] for g in plan["groups"]} == {"p=b"}
    assert table.run_clustering() == [instant]
    table.upsert(pa.Table.from_pylist(rows(range(900, 905), "c", "new"), schema=SCHEMA))
    table.upsert(pa.Table.from_pylist(rows(range(905, 910), "c", "new"), schema=SCHEMA))
    model.apply("upsert", rows(range(900, 910), "c", "new"))
    recent = table.schedule_clustering(sort_columns=["v"], partitions=1)
    plan = table.context.timeline.plan(table.context.timeline.get(recent))
    assert {g["partition"] for g in plan["groups"]} == {"p=c"}
    table.run_clustering()
    assert snapshot(table) == model.expected()


def test_key_range_strategy_groups_overlapping_files(tmp_path):
    table, model = loaded(str(tmp_path / "t"), "copy_on_write")
    table = reopened(table, **{"clustering.strategy": "key_range"})
    instant = table.cluster()
    assert instant is not None
    assert snapshot(table) == model.expected()
    ranges = table.metadata_index.ranges([(p, fs.base.file_name) for (p, _), fs in table.file_slices().items()],
                                        table.config.metadata_indexes)
    for p in ("p=a", "p=b"):
        spans = sorted(r for (q, _), r in ranges.items() if q == p)
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:])), "after clustering, key ranges do not overlap"


def in_bucket(table: mt.Table, m: int) -> None:
    """Every key sits in the file group of bucket hash32(key) % m."""
    for (_, file_id), fs in table.file_slices().items():
        assert set(bucket_ids(pa.array(read_keys(table, fs), pa.string()), m).tolist()) <= {bucket_of(file_id)}, file_id


def read_keys(table: mt.Table, fs) -> list[str]:
    return read_slice(table.context.storage, table.context.paths, table.config, fs)[KEY_COLUMN].to_pylist()


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_bucket_count_change(tmp_path, table_type):
    table, model = loaded(str(tmp_path / "t"), table_type, index="bucket", buckets=4)
    old = {key: bucket_of(fid) for (p, fid), fs in table.file_slices().items()
           for key in read_keys(table, fs)}
    assert table.cluster(num_buckets=8) is not None  # multiple rehash
    for (p, fid), fs in table.file_slices().items():
        assert len({old[k] for k in read_keys(table, fs)}) == 1, "each new bucket comes from one old bucket"
    in_bucket(table, 8)
    assert snapshot(table) == model.expected()
    batch = rows(range(0, 400, 7), "a", "after8", 9)
    table.upsert(pa.Table.from_pylist(batch, schema=SCHEMA))
    model.apply("upsert", batch)
    assert table.cluster(num_buckets=6) is not None  # overwrite
    in_bucket(table, 6)
    assert snapshot(table) == model.expected()
    table.delete(pa.Table.from_pylist(rows(range(0, 50), "a", "x"), schema=SCHEMA).select(["id", "p"]))
    model.apply("delete", rows(range(0, 50), "a", "x"))
    assert snapshot(table) == model.expected()
    found = table.lookup(pa.table({"id": [60, 61], "p": ["a", "a"]}))
    assert all(found["file_id"].to_pylist())
    check_metadata(table)
    reopened = mt.Table.open(table.path)
    assert reopened.context.view().bucket_layout(reopened.config.index.num_buckets).num_buckets == 6
    assert table.cluster(num_buckets=6) is None


@pytest.mark.slow
@pytest.mark.parametrize("table_type,updates", [("merge_on_read", "reject"), ("copy_on_write", "reject"),
                                                ("merge_on_read", "abort_clustering"),
                                                ("copy_on_write", "abort_clustering")])
def test_a_write_that_began_before_the_clustering_commits_after_it(tmp_path, table_type, updates):
    """Merge-on-read: the clustering commits and the write's logs are split among the new file groups, with
    either `clustering.updates`. Copy-on-write: the write fails with the named error, or with
    abort_clustering the clustering yields to the running write."""
    table, model = loaded(str(tmp_path / "t"), table_type)
    table = reopened(table, **{"clustering.updates": updates})
    batch = rows(range(0, 300, 3), "a", "late", 9)
    options = {**SMALL, "clustering.updates": updates}
    go = tmp_path / "go"
    writer = act(table.path, "upsert", batch, options, **held_at("table.write.files", go))
    wait_held(writer, go)  # the writer has tagged and written its files
    yields = table_type == "copy_on_write" and updates == "abort_clustering"
    if yields:
        with pytest.raises(ConflictError, match="is writing to"):
            table.cluster()
    else:
        assert table.cluster() is not None
    go.touch()
    code, out, err = finished(writer)
    if table_type == "merge_on_read" or yields:
        assert code == 0, out + err
        model.apply("upsert", batch)
    else:
        assert code == 3 and "clustering" in out, out + err
    assert snapshot(table) == model.expected()
    check_metadata(mt.Table.open(table.path))


def a_write_wins_over_a_clusterer_held_at(table: mt.Table, model: TableModel, point: str) -> tuple[int, str, str]:
    """A clusterer process held at `point` once its plan exists, while an abort_clustering write wins;
    returns how the clusterer ended."""
    go = os.path.join(os.path.dirname(table.path), "go")
    clusterer = act(table.path, "cluster", [], SMALL, **held_at(point, go))
    wait_held(clusterer, go)
    batch = rows(range(0, 20), "a", "wins", 9)
    mt.Table.open(table.path, options={"clustering.updates": "abort_clustering"}).upsert(
        pa.Table.from_pylist(batch, schema=SCHEMA))
    model.apply("upsert", batch)
    open(go, "w").close()
    return finished(clusterer)


@pytest.mark.slow
def test_abort_clustering_rolls_back_a_running_clustering(tmp_path):
    table, model = loaded(str(tmp_path / "t"))
    table = reopened(table)
    code, out, err = a_write_wins_over_a_clusterer_held_at(table, model, "table.clustering.files")
    assert code == 3 and "a write won over it" in out, out + err
    assert not table.context.timeline.pending()
    assert snapshot(table) == model.expected()
    check_metadata(mt.Table.open(table.path))  # the rolled-back clustering left no files behind
    assert table.cluster() is not None


def test_a_clustering_rolled_back_between_its_schedule_and_its_run_is_a_conflict(tmp_path):
    """cluster() = schedule + run: a write that wins in between rolls the plan back; the clusterer gets the
    named conflict, not "no pending clustering" (found by the writers-and-clusterer process test)."""
    table, model = loaded(str(tmp_path / "t"))
    table = reopened(table)
    code, out, err = a_write_wins_over_a_clusterer_held_at(table, model, "table.clustering.scheduled")
    assert code == 3 and "rolled back before it ran" in out, out + err
    assert not table.context.timeline.pending()
    assert snapshot(table) == model.expected()


def test_an_inflight_clustering_without_a_heartbeat_is_recovered(tmp_path):
    table, model = loaded(str(tmp_path / "t"))
    table = reopened(table)
    instant = table.schedule_clustering(sort_columns=["v"])
    timeline = table.context.timeline
    timeline.start(timeline.get(instant))  # inflight, and no process ever beat for it
    assert timeline.get(instant).state.value == "inflight"
    assert table.run_clustering() == [instant]
    assert snapshot(table) == model.expected()
    check_metadata(table)


def test_reject_names_the_clustering_to_wait_for(tmp_path):
    table, model = loaded(str(tmp_path / "t"))
    table = reopened(table)
    instant = table.schedule_clustering()
    with pytest.raises(ClusteringConflict, match=f"clustering {instant}") as raised:
        table.upsert(pa.Table.from_pylist(rows(range(0, 5), "a", "x", 9), schema=SCHEMA))
    assert raised.value.clustering == instant
    table.upsert(pa.Table.from_pylist(rows(range(5000, 5005), "a", "new", 9), schema=SCHEMA))  # inserts go elsewhere
    model.apply("upsert", rows(range(5000, 5005), "a", "new", 9))
    assert table.run_clustering() == [instant]
    assert snapshot(table) == model.expected()


def test_a_view_outlives_a_clustering_rolled_back_after_it_listed_the_timeline(tmp_path):
    """A write that wins over a clustering removes its plan at any moment; a view that listed the clustering
    as pending reads no plan for it (found by the writers-and-clusterer process test)."""
    table, _ = loaded(str(tmp_path / "t"))
    instant = reopened(table).schedule_clustering()
    view = table.context.view()  # lists the clustering as pending
    assert view.busy()
    table.context.transactions.rollback(table.context.timeline.get(instant))
    assert view.busy() == set() and view.pending_rings() == {}


@pytest.mark.slow
@pytest.mark.parametrize("point", ["table.clustering.files", "metadata.write.log", "table.commit.metadata",
                                   "metadata.complete", "table.commit", "random"])
def test_sigkill_of_a_clustering(tmp_path, point):
    table, model = loaded(str(tmp_path / "t"))
    table = reopened(table)
    if point == "random":
        proc = act(table.path, "cluster", [], {**SMALL, "clustering.sort_columns": "v"})
        time.sleep(random.uniform(0.8, 2.5))
        proc.send_signal(signal.SIGKILL)
        code, _, _ = finished(proc)
    else:
        code, out, err = finished(act(table.path, "cluster", [], {**SMALL, "clustering.sort_columns": "v"},
                                      METATABLE_CRASH_AT=point))
        assert code == -signal.SIGKILL, out + err
    time.sleep(0.5)  # its heartbeat expires
    fresh = mt.Table.open(table.path)
    assert snapshot(fresh) == model.expected()
    done = fresh.run_clustering()  # resumes the interrupted plan (if it got as far as planning)
    assert snapshot(fresh) == model.expected()
    assert not fresh.context.timeline.pending()
    check_metadata(fresh)
    for names in fresh.context.view().live_files.values():  # no twins: one base per file group and instant
        bases = [BaseFile.parse(n) for n in names if n.endswith(".parquet")]
        assert len({(b.file_id, b.instant) for b in bases}) == len(bases)
    completed = [i for i in fresh.context.timeline.completed(DATA_ACTIONS) if i.action is Action.REPLACECOMMIT]
    assert completed or not done
    assert fresh.cluster(sort_columns=["v"]) is not None, "the next clustering succeeds"
    assert snapshot(fresh) == model.expected()


def model_of(table: mt.Table, journals: list[str]) -> tuple[TableModel, list[dict]]:
    commits, rejected = [], []
    for path in journals:
        for line in open(path):
            entry = json.loads(line)
            if "rejected" in entry:
                rejected.append(entry)
                continue
            instant = table.context.timeline.get(entry["instant"])
            assert instant is not None and instant.is_completed, entry["instant"]
            commits.append((table.context.timeline.read_json(instant)["completed_at"], entry["rows"]))
    model = TableModel(True)
    for _, batch in sorted(commits, key=lambda c: c[0]):
        model.apply("upsert", batch)
    return model, rejected


@pytest.mark.slow
@pytest.mark.parametrize("table_type,index,updates,lake", [
    ("merge_on_read", "bloom", "reject", "local"), ("copy_on_write", "bloom", "reject", "local"),
    ("merge_on_read", "bucket", "reject", "local"), ("merge_on_read", "bloom", "abort_clustering", "s3")],
    indirect=["lake"])  # abort_clustering on the RGW only: the storage matters less than the suite's time
def test_writers_keep_writing_while_another_process_clusters(lake, tmp_path, table_type, index, updates):
    """Two writer processes upsert in a loop (each its own partition) while a third clusters repeatedly:
    nothing committed is lost or duplicated; every writer failure is the named reject error (none with
    abort_clustering). Once on the RGW too."""
    root = lake / "t"
    options = {**SMALL, "clustering.updates": updates, "clean.inline": True, "clean.retain_commits": 4,
               "heartbeat.interval_s": 0.5}
    mt.Table.create(root, SCHEMA, "id", "p", "ts", table_type=table_type,
                    index=mt.IndexConfig(type=index, num_buckets=2),
                    metadata_indexes=["column_stats", "bloom_filter"], options=options)
    deadline = time.time() + (10 if lake.remote else 6)  # locally ~13 clusterings in 6 s; the check wants 2
    journals = [str(tmp_path / f"journal-{i}") for i in range(3)]
    procs = [child("clustering_child", root, "write", journals[i], str(i), str(deadline), json.dumps(options))
             for i in range(2)]
    clusterer = {**options, "write.target_file_size": 1 << 20, "clustering.sort_columns": "v"}
    procs.append(child("clustering_child", root, "cluster", journals[2], "0", str(deadline), json.dumps(clusterer)))
    all_succeed(procs, timeout=180)
    table = mt.Table.open(root)
    model, rejected = model_of(table, journals[:2])
    clustered = [json.loads(line) for line in open(journals[2])]
    assert sum(1 for c in clustered if c.get("clustered")) >= (1 if updates == "abort_clustering" else 2), clustered
    assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
    keys = [(r["p"], r["id"]) for r in table.to_arrow().to_pylist()]
    assert len(keys) == len(set(keys))
    if updates == "abort_clustering":
        assert not rejected
    assert all("clustering" in r["rejected"] for r in rejected)
    table.rollback()
    table.run_clustering()
    check_metadata(table)
