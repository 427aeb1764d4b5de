import os

import pytest

from metatable.errors import (
    CorruptFileError, InvalidInputError, RollbackError, TableExistsError, TableNotFoundError, TimelineError,
    UnknownPartitionError)
from metatable.metadata.records import MetadataIntegrityError
from metatable.metadata.table import MetadataTable
from metatable.timeline.instant import Action

from .models import Model


def files(*names, dead=()):
    entries = {n: {"size": 10, "is_deleted": False} for n in names}
    entries.update({n: {"size": 0, "is_deleted": True} for n in dead})
    return {"files": entries, "is_deleted": False}


def ring(seq, path="p"):
    return {"version": 1, "partition_path": path, "instant": "x", "seq_no": seq, "num_buckets": 1,
            "nodes": [{"value": 2147483647, "file_id_prefix": "b0", "tag": "NORMAL"}], "is_deleted": False}


@pytest.fixture
def mdt(tmp_path):
    return MetadataTable.create(str(tmp_path / "m"), {"files": 2, "bloom_filter": 1, "column_stats": 2,
                                                      "hashing_meta": 1},
                                options={"metadata.compact.max_delta_commits": 3})


def test_create_open_errors(tmp_path, mdt):
    with pytest.raises(TableExistsError):
        MetadataTable.create(mdt.root)
    with pytest.raises(TableNotFoundError, match="no metadata table"):
        MetadataTable.open(str(tmp_path / "nope"))
    with pytest.raises(UnknownPartitionError, match="unknown metadata partition 'record_index'"):
        mdt.get("record_index", "k")
    with pytest.raises(UnknownPartitionError):
        MetadataTable.create(str(tmp_path / "x"), {"nope": 1})


def test_commit_get_scan(mdt):
    mdt.commit({"files": {"p1": files("a", "b"), "p2": files("c")}})
    mdt.commit({"files": {"p1": files(dead=["a"]), "p2": None, "p3": files("d")}})
    assert mdt.get("files", "p1") == {"files": {"b": {"size": 10, "is_deleted": False}}, "is_deleted": False}
    assert mdt.get("files", "p2") is None
    assert set(mdt.get_many("files", ["p1", "p2", "p3", "zz"])) == {"p1", "p3"}
    assert [k for k, _ in mdt.scan("files")] == ["p1", "p3"]
    assert [k for k, _ in mdt.scan("files", prefix="p3")] == ["p3"]


def test_bad_records_and_keys(mdt):
    with pytest.raises(InvalidInputError, match="does not fit the files schema"):
        mdt.commit({"files": {"p": {"files": {"a": {"size": "big"}}}}})
    with pytest.raises(InvalidInputError, match="non-empty"):
        mdt.commit({"files": {"": files("a")}})
    with pytest.raises(UnknownPartitionError):
        mdt.commit({"nope": {"k": None}})


def test_compaction_is_automatic_and_preserves_reads(mdt):
    model = Model()
    for i in range(7):
        recs = {"files": {f"p{i % 3}": files(f"f{i}", dead=[f"f{i - 2}"])}}
        model.commits[mdt.commit(recs)] = recs
    compactions = mdt.timeline.completed([Action.COMPACTION])
    assert compactions, "3 logs per file group should have triggered compaction"
    assert dict(mdt.scan("files")) == model.expected("files")
    reopened = MetadataTable.open(mdt.root)
    assert dict(reopened.scan("files")) == model.expected("files")


def test_a_file_group_whose_logs_pass_max_log_bytes_compacts_at_once(tmp_path):
    """One big commit (a load's record-index entries) goes to SST at once, not after max_delta_commits;
    a small one waits."""
    options = {"metadata.compact.max_delta_commits": 10, "metadata.compact.max_log_bytes": 16 << 10}
    entry = {"partition_path": "p", "file_id": "f", "instant": "1", "completed_at": 1, "is_deleted": False}
    small = MetadataTable.create(str(tmp_path / "s"), {"record_index": 2}, options=options)
    small.commit({"record_index": {"k": entry}})
    assert not small.timeline.completed([Action.COMPACTION])
    big = MetadataTable.create(str(tmp_path / "b"), {"record_index": 2}, options=options)
    big.commit({"record_index": {f"k{i:05d}": entry for i in range(4000)}})  # ~32 KB of log per file group
    assert big.timeline.completed([Action.COMPACTION]), "logs past max_log_bytes should have been compacted"
    assert sorted(n for n in os.listdir(os.path.join(big.root, "record_index")) if n.endswith(".sst")) \
        == [f"record-index-{i:04d}_compacted_{big.timeline.completed([Action.COMPACTION])[-1].time}.sst"
            for i in range(2)]
    assert big.get_many("record_index", ["k00000", "k03999", "zz"]) == {"k00000": entry, "k03999": entry}


def test_old_reader_keeps_its_view(mdt):
    mdt.commit({"files": {"p": files("a")}})
    old = MetadataTable.open(mdt.root)
    mdt.commit({"files": {"p": files("b"), "q": files("c")}})
    mdt.compact(force=True)
    assert old.get("files", "p")["files"].keys() == {"a"}
    assert old.get("files", "q") is None
    old.refresh()
    assert old.get("files", "p")["files"].keys() == {"a", "b"}


def test_rollback_pending_and_completed(mdt):
    t1 = mdt.commit({"files": {"p": files("a")}})
    t2 = mdt.begin()
    mdt.write(t2, {"files": {"p": files("b")}})
    assert mdt.get("files", "p")["files"].keys() == {"a"}  # not completed: invisible
    mdt.rollback(t2)
    assert mdt.timeline.get(t2) is None
    with pytest.raises(TimelineError):
        mdt.complete(t2)
    t3 = mdt.commit({"files": {"p": files("c")}})
    mdt.rollback(t3)  # completed: undone by a rollback block
    assert mdt.get("files", "p")["files"].keys() == {"a"}
    assert MetadataTable.open(mdt.root).get("files", "p")["files"].keys() == {"a"}
    mdt.compact(force=True)
    assert mdt.get("files", "p")["files"].keys() == {"a"}
    with pytest.raises(RollbackError, match="compacted"):
        mdt.rollback(t1)


def test_pending_instant_blocks_compaction_and_says_why(mdt, caplog):
    t = mdt.begin()
    mdt.write(t, {"files": {"p": files("x")}})
    for i in range(4):
        mdt.commit({"files": {"p": files(f"f{i}")}})
    report = mdt.compact()
    assert report.instant is None and any(t in why for why in report.blocked)
    assert "blocked" in caplog.text
    mdt.complete(t)
    mdt.refresh()
    report = mdt.compact()
    assert report.instant is not None
    assert mdt.get("files", "p")["files"].keys() == {"x", "f0", "f1", "f2", "f3"}


def test_dead_writer_is_rolled_back_by_next_writer(tmp_path, fast_heartbeat):
    import time
    mdt = MetadataTable.create(str(tmp_path / "m"), ["files"], options=fast_heartbeat)
    t = mdt.begin()
    mdt.write(t, {"files": {"p": files("x")}})
    time.sleep(0.3)
    mdt.commit({"files": {"p": files("y")}})
    assert mdt.timeline.get(t) is None
    assert mdt.get("files", "p")["files"].keys() == {"y"}


def test_clean_keeps_the_last_slices(mdt):
    for i in range(12):
        mdt.commit({"files": {"p": files(f"f{i}")}})
    part = os.path.join(mdt.root, "files")
    for gid in {n.split("_")[0].lstrip(".") for n in os.listdir(part)}:
        bases = [n for n in os.listdir(part) if n.startswith(gid + "_") and n.endswith(".sst")]
        assert len(bases) <= 2
    assert mdt.get("files", "p")["files"].keys() == {f"f{i}" for i in range(12)}


def test_hashing_meta_seq_no_must_advance_by_one(mdt):
    mdt.commit({"hashing_meta": {"p": ring(0)}})
    with pytest.raises(MetadataIntegrityError, match="must be 1"):
        mdt.commit({"hashing_meta": {"p": ring(2)}})
    mdt.commit({"hashing_meta": {"p": ring(1)}})
    assert mdt.get("hashing_meta", "p")["seq_no"] == 1


def test_corrupt_completed_log_is_named_and_nothing_else_lost(mdt):
    mdt.commit({"files": {"p": files("a")}, "column_stats": {"k": None}})
    t = mdt.commit({"files": {"p": files("b")}})
    logs = mdt.timeline.read_json(mdt.timeline.get(t))["logs"]
    victim = os.path.join(mdt.root, logs[0])
    data = open(victim, "rb").read()
    open(victim, "wb").write(data[: len(data) // 2])
    fresh = MetadataTable.open(mdt.root)
    with pytest.raises(CorruptFileError, match=os.path.basename(victim)):
        fresh.get("files", "p")
    assert fresh.get("column_stats", "k") is None  # other file groups still read


def test_torn_log_of_uncompleted_instant_is_ignored(mdt):
    mdt.commit({"files": {"p": files("a")}})
    t = mdt.begin()
    mdt.write(t, {"files": {"p": files("b")}})
    logs = mdt.timeline.read_json(mdt.timeline.get(t))["logs"]
    open(os.path.join(mdt.root, logs[0]), "wb").write(b"\x00torn")
    assert MetadataTable.open(mdt.root).get("files", "p")["files"].keys() == {"a"}


def test_garbage_sst_is_named(mdt):
    for i in range(3):
        mdt.commit({"files": {"p": files(f"f{i}")}})
    part = os.path.join(mdt.root, "files")
    sst = [n for n in os.listdir(part) if n.endswith(".sst")][0]
    open(os.path.join(part, sst), "wb").write(b"garbage" * 50)
    with pytest.raises(CorruptFileError, match=sst):
        MetadataTable.open(mdt.root).scan("files").__next__()


def test_logs_of_a_rolled_back_compaction_stay_visible_after_archival_passes_it(tmp_path):
    """Found by an RGW soak: commits made while a metadata compaction was pending write their logs in its slice
    (named after its instant). The compaction was rolled back, then archival moved the metadata timeline past
    its instant, and an instant at or before the archive's end counts as completed: its slice's logs were taken
    for logs of a base that no longer exists, and the `files` records they held vanished (a data table lost 34
    committed rows). They stay with the slice before it, beside the logs written there after the rollback."""
    mdt = MetadataTable.create(str(tmp_path / "m"), {"files": 1},
                               options={"metadata.auto_compact": False, "metadata.archive.max_instants": 4,
                                        "metadata.archive.min_instants": 2})
    mdt.commit({"files": {"p": files("a")}})
    mdt.compact(force=True)
    plan = {"file_groups": {"files-0000": {"partition": "files", "logs": []}}}
    pending = mdt.timeline.request(Action.COMPACTION, plan=plan, beat=False)  # as a killed compaction leaves it
    mdt.commit({"files": {"p": files("b")}})  # in the pending compaction's slice
    mdt.commit({"files": {"p": files("c", dead=["a"])}})
    mdt.transactions.rollback(pending)
    assert mdt.timeline.get(pending.time) is None
    mdt.commit({"files": {"p": files("d", dead=["b"])}})  # after the rollback, in the slice before it
    for _ in range(4):
        mdt.commit({"files": {"q": files("x")}})
    assert mdt.archive() and MetadataTable.open(mdt.root).timeline.archived.until > pending.time
    for table in (mdt, MetadataTable.open(mdt.root)):
        table.refresh()
        assert {n for n, e in table.get("files", "p")["files"].items() if not e["is_deleted"]} == {"c", "d"}
    mdt.compact(force=True)
    assert {n for n, e in mdt.get("files", "p")["files"].items() if not e["is_deleted"]} == {"c", "d"}
