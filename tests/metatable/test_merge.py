"""`Table.merge`: a conditional merge (matched update, matched delete, not-matched insert, each with a
condition) in one commit, through the index, on every index and table type; against a plain model."""
from __future__ import annotations

import os
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metatable as mt
from metatable.errors import InvalidInputError

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("v", pa.string()), ("ts", pa.int64())])
INDEXES = {
    "bucket": (mt.IndexConfig(type="bucket", num_buckets=2), ("column_stats",)),
    "consistent_hashing": (mt.IndexConfig(type="bucket", engine="consistent_hashing", num_buckets=2),
                           ("column_stats",)),
    "bloom_global": (mt.IndexConfig(type="bloom", scope="global"), ("column_stats", "bloom_filter")),
    "record": (mt.IndexConfig(type="record"), ("column_stats",)),
}


def new_table(path, kind: str = "bucket", table_type: str = "merge_on_read") -> mt.Table:
    index, metadata = INDEXES[kind]
    return mt.Table.create(str(path), SCHEMA, "id", ["p"], "ts", table_type, index, metadata)


def rows(ids, p, v, ts, **extra) -> pa.Table:
    n = len(ids)
    table = pa.table({"id": pa.array(ids, pa.int64()), "p": p if isinstance(p, list) else [p] * n,
                      "v": v if isinstance(v, list) else [v] * n,
                      "ts": pa.array(ts if isinstance(ts, list) else [ts] * n, pa.int64())})
    for name, values in extra.items():
        table = table.append_column(name, pa.array(values))
    return table


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
@pytest.mark.parametrize("kind", list(INDEXES))
def test_each_clause_does_its_part_in_one_commit(tmp_path, kind, table_type):
    t = new_table(tmp_path / "t", kind, table_type)
    t.upsert(rows([1, 2, 3, 4], ["a", "a", "b", "b"], ["x", "y", "closed", "w"], 5))
    before = {i.time for i in t.timeline()}
    source = rows([1, 2, 3, 4, 5, 6], ["a", "a", "b", "b", "a", "b"], ["X", "Y", "Z", "W", "N", "M"],
                  [6, 4, 6, 6, 1, 1], op=["U", "U", "U", "D", "I", "D"])
    r = t.merge(source, matched_update=[("target.v", "!=", "closed")], matched_delete=[("op", "==", "D")],
                not_matched_insert=[("op", "!=", "D")])
    assert (r.operation, r.inserted, r.updated, r.deleted, r.skipped, r.stale) == ("merge", 1, 1, 1, 2, 1)
    written = [i for i in t.timeline() if i.time not in before and i.action.value in ("commit", "deltacommit")]
    assert len(written) == 1  # one commit, however many services ran after it
    assert t.to_arrow().sort_by("id").to_pylist() == [
        {"id": 1, "p": "a", "v": "X", "ts": 6},  # updated
        {"id": 2, "p": "a", "v": "y", "ts": 5},  # stale: 4 < 5
        {"id": 3, "p": "b", "v": "closed", "ts": 5},  # the update's condition on the table's row
        {"id": 5, "p": "a", "v": "N", "ts": 1}]  # inserted; 6 was a delete of a key the table lacks
    assert t.lookup(pa.table({"id": [4, 5]}).append_column("p", pa.array(["b", "a"])))["file_id"][0].as_py() is None
    assert t.fsck().healthy


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
@pytest.mark.parametrize("kind", list(INDEXES))
def test_an_upsert_counts_updates_that_lose_on_ordering_apart(tmp_path, kind, table_type):
    t = new_table(tmp_path / "t", kind, table_type)
    t.upsert(rows(range(10), "a", "x", 5))
    t.upsert(rows([8, 9], "a", "y", 7))  # merge-on-read: the stored value of 8 and 9 is in a log
    r = t.upsert(rows(range(12), "a", "z", [4] * 5 + [5] * 3 + [6] * 4))
    # 0-4 lose (4 < 5); 5-7 tie and win; 8-9 lose to the log's 7; 10-11 are new
    assert (r.inserted, r.updated, r.stale) == (2, 3, 7)
    assert {row["id"]: row["v"] for row in t.to_arrow().to_pylist()} == {
        **{i: "x" for i in range(5)}, 5: "z", 6: "z", 7: "z", 8: "y", 9: "y", 10: "z", 11: "z"}


def test_a_few_updates_of_a_large_base_read_only_their_pages_to_count(tmp_path):
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", ordering_field="ts",
                        index=mt.IndexConfig(type="bucket", num_buckets=1))
    t.upsert(rows(range(20000), "a", "x", 5))
    r = t.upsert(rows([3, 7000, 19999, 20000], "a", "y", [4, 6, 5, 1]))
    assert (r.inserted, r.updated, r.stale) == (1, 2, 1)


@pytest.mark.parametrize("ordering", [pa.date32(), pa.timestamp("us", tz="UTC"), pa.int32()])
def test_stale_counts_read_only_what_can_win_whatever_the_ordering_type(tmp_path, ordering):
    schema = pa.schema([("id", pa.int64()), ("ts", ordering)])

    def batch(ids, ts):
        return pa.table({"id": pa.array(ids, pa.int64()), "ts": pa.array(ts, pa.int32()).cast(
            pa.int64() if pa.types.is_timestamp(ordering) else pa.int32()).cast(ordering)})
    t = mt.Table.create(str(tmp_path / "t"), schema, "id", ordering_field="ts", index=mt.IndexConfig(num_buckets=1))
    t.upsert(batch(range(5000), [10] * 5000))
    t.upsert(batch([1, 2], [30, 30]))  # a log whose values are above the next batch's least
    r = t.upsert(batch([1, 2, 3, 4], [20, 40, 20, 5]))  # base max 10: the base is read (5 < 10)
    assert (r.updated, r.stale) == (2, 2)  # 1 loses to the log's 30, 4 to the base's 10
    r = t.upsert(batch([3, 2, 7], [50, 35, 11]))  # least 11 > base max: only the logs are read
    assert (r.updated, r.stale) == (2, 1)  # 2 loses to the log's 40


def test_an_expression_compares_source_and_target_columns(tmp_path):
    t = new_table(tmp_path / "t")
    t.upsert(rows([1, 2], "a", "x", 5))
    r = t.merge(rows([1, 2], "a", ["new", "old"], [7, 3]),
                matched_update=pc.field("ts") > pc.field("target.ts"))
    assert (r.updated, r.skipped, r.stale) == (1, 1, 0)
    assert t.to_arrow().sort_by("id")["v"].to_pylist() == ["new", "x"]


def test_a_global_index_deletes_where_the_key_lives_and_moves_updated_keys(tmp_path):
    t = new_table(tmp_path / "t", "bloom_global")
    t.upsert(rows([1, 2, 3], "a", "x", 1))
    r = t.merge(rows([1, 2], "b", "moved", 2, op=["U", "D"]), matched_update=[("op", "==", "U")],
                matched_delete=[("op", "==", "D")])
    assert (r.inserted, r.updated, r.deleted) == (1, 0, 2)  # a move counts as a delete and an insert, as upsert's
    assert t.to_arrow().sort_by("id").select(["id", "p", "v"]).to_pylist() == [
        {"id": 1, "p": "b", "v": "moved"}, {"id": 3, "p": "a", "v": "x"}]


def test_refusals_write_nothing(tmp_path, spark):
    t = new_table(tmp_path / "t")
    t.upsert(rows([1], "a", "x", 1))
    instants = [i.time for i in t.timeline()]
    source = rows([1], "a", "y", 2)
    with pytest.raises(InvalidInputError, match="at least one of matched_update"):
        t.merge(source)
    with pytest.raises(InvalidInputError, match="matched_update.*'nope'.*target.<column>"):
        t.merge(source, matched_update=[("nope", "==", 1)])
    with pytest.raises(InvalidInputError, match="does not convert"):
        t.merge(source, matched_update=[("target.ts", "==", "soon")])
    with pytest.raises(InvalidInputError, match="matched_delete.*cannot be evaluated.*target.nope"):
        t.merge(source, matched_delete=pc.field("target.nope") > 1)
    with pytest.raises(InvalidInputError, match="1 record keys more than once"):
        t.merge(pa.concat_tables([source, source]), matched_update=True)
    with pytest.raises(InvalidInputError, match="lacks columns"):
        t.merge(source.drop_columns(["v"]), not_matched_insert=True)
    with pytest.raises(InvalidInputError, match="toArrow"):
        t.merge(spark.createDataFrame(source.to_pandas()), matched_update=True)
    assert [i.time for i in t.timeline()] == instants
    assert t.to_arrow().to_pylist() == [{"id": 1, "p": "a", "v": "x", "ts": 1}]
    # a delete-only merge needs only the key and partition columns
    assert t.merge(source.select(["id", "p"]), matched_delete=True).deleted == 1


def test_a_source_may_leave_out_columns_added_since_the_table_was_created(tmp_path):
    t = new_table(tmp_path / "t")
    t.upsert(rows([1], "a", "x", 1))
    t.add_columns([pa.field("note", pa.string())])
    r = t.merge(rows([1, 2], "a", "y", 2, op=["U", "I"]), matched_update=True, not_matched_insert=True)
    assert (r.updated, r.inserted) == (1, 1)
    assert t.to_arrow().sort_by("id").select(["id", "v", "note"]).to_pylist() == [
        {"id": 1, "v": "y", "note": None}, {"id": 2, "v": "y", "note": None}]


def test_a_replayed_txn_lands_once(tmp_path):
    t = new_table(tmp_path / "t")
    source = rows([1, 2], "a", "x", 1)
    assert t.merge(source, not_matched_insert=True, txn=mt.Txn("cdc", 1)).inserted == 2
    again = t.merge(rows([1, 2], "a", "y", 2), matched_update=True, txn=mt.Txn("cdc", 1))
    assert again.updated == 0 and set(t.to_arrow()["v"].to_pylist()) == {"x"}


# -- against a model ---------------------------------------------------------------------------------------
KEYS = st.integers(0, 11)
condition = st.sampled_from([None, True, [("op", "==", "D")], [("op", "!=", "D")], [("target.v", "==", "v0")],
                             [[("op", "==", "I")], [("target.ts", ">", 2)]], pc.field("ts") >= pc.field("target.ts")])


def holds(cond, src: dict, tgt: dict | None) -> bool:
    if cond is None:
        return False
    if cond is True:
        return True
    row = {**src, **{f"target.{k}": v for k, v in (tgt or {}).items()}}
    if isinstance(cond, pc.Expression):
        return tgt is not None and src["ts"] >= tgt["ts"]
    conjunctions = cond if isinstance(cond[0], list) else [cond]

    def one(c):
        value = row.get(c[0])
        return value is not None and {"==": value == c[2], "!=": value != c[2], ">": value > c[2]}[c[1]]
    return any(all(one(c) for c in conj) for conj in conjunctions)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(list(INDEXES)), table_type=st.sampled_from(["merge_on_read", "copy_on_write"]),
       initial=st.sets(KEYS, max_size=8),
       merges=st.lists(st.tuples(st.dictionaries(KEYS, st.tuples(st.sampled_from("UID"), st.integers(0, 4)),
                                                 min_size=1, max_size=8), condition, condition, condition),
                       min_size=1, max_size=4))
def test_merges_equal_the_model(tmp_path_factory, kind, table_type, initial, merges):
    t = new_table(tmp_path_factory.mktemp("merge") / "t", kind, table_type)
    model: dict[int, dict] = {}
    if initial:
        first = rows(sorted(initial), [f"p{i % 2}" for i in sorted(initial)], "v0", 2)
        t.upsert(first)
        model = {r["id"]: r for r in first.to_pylist()}
    for n, (changes, update, delete, insert) in enumerate(merges, start=1):
        if update is None and delete is None and insert is None:
            insert = True
        ids = sorted(changes)
        source = rows(ids, [f"p{i % 2}" for i in ids], f"v{n}", [changes[i][1] for i in ids],
                      op=[changes[i][0] for i in ids])
        expected = dict(model)
        tally = {"inserted": 0, "updated": 0, "deleted": 0, "skipped": 0, "stale": 0}
        for src in source.to_pylist():
            tgt = model.get(src["id"])
            row = {k: src[k] for k in ("id", "p", "v", "ts")}
            if tgt is not None and holds(delete, src, tgt):
                del expected[src["id"]]
                tally["deleted"] += 1
            elif tgt is not None and holds(update, src, tgt):
                if src["ts"] < tgt["ts"]:
                    tally["stale"] += 1
                else:
                    expected[src["id"]] = row
                    tally["updated"] += 1
            elif tgt is None and holds(insert, src, None):
                expected[src["id"]] = row
                tally["inserted"] += 1
            else:
                tally["skipped"] += 1
        r = t.merge(source, matched_update=update, matched_delete=delete, not_matched_insert=insert)
        assert {k: getattr(r, k) for k in tally} == tally
        model = expected
        assert sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"]) == [model[k] for k in sorted(model)]


# -- change feeds: upserts and deletes in one commit ----------------------------------------------------------
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(list(INDEXES)), table_type=st.sampled_from(["merge_on_read", "copy_on_write"]),
       batches=st.lists(st.lists(st.tuples(KEYS, st.sampled_from(["c", "u", "d"])), min_size=1, max_size=10),
                        min_size=1, max_size=4))
def test_change_batches_equal_the_model(tmp_path_factory, kind, table_type, batches):
    t = new_table(tmp_path_factory.mktemp("changes") / "t", kind, table_type)
    model: dict[int, dict] = {}
    clock = 0
    for n, changes in enumerate(batches):
        ts = list(range(clock, clock + len(changes)))  # a feed's rows are ordered: the last of a key wins
        clock += len(changes)
        ids = [k for k, _ in changes]
        batch = rows(ids, [f"p{i % 2}" for i in ids], f"v{n}", ts, op=[op for _, op in changes])
        newest = {}
        for row in batch.to_pylist():
            newest[row["id"]] = row
        deleted = sum(1 for r in newest.values() if r["op"] == "d" and r["id"] in model)
        for key, row in newest.items():
            if row["op"] == "d":
                model.pop(key, None)
            else:
                model[key] = {k: row[k] for k in ("id", "p", "v", "ts")}
        r = t.apply_changes(batch)
        assert r.deleted == deleted
        assert sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"]) == [model[k] for k in sorted(model)]


def test_a_change_feed_names_its_operation_column(tmp_path):
    t = new_table(tmp_path / "t")
    with pytest.raises(InvalidInputError, match="no operation column 'op'.*operation_column="):
        t.apply_changes(rows([1], "a", "x", 1))
    r = t.apply_changes(rows([1, 2], "a", "x", 1, kind=["I", "X"]), operation_column="kind", delete_values=["X"])
    assert (r.inserted, r.deleted) == (1, 0) and t.schema.names == SCHEMA.names


def test_a_stream_with_an_operation_column_upserts_and_deletes(spark, tmp_path):
    t = new_table(tmp_path / "t")
    source = tmp_path / "feed"
    source.mkdir()
    pq.write_table(rows([1, 2, 3], "a", "x", 1, op=["c", "c", "c"]), source / "0.parquet")
    pq.write_table(rows([2, 3, 4, 3], "a", ["y", "gone", "z", "back"], [2, 2, 2, 3], op=["u", "d", "c", "c"]),
                   source / "1.parquet")
    pq.write_table(rows([1], "a", "gone", 4, op=["d"]), source / "2.parquet")
    for i in range(3):  # the file source takes files in modification-time order: ties (one millisecond) any way
        os.utime(source / f"{i}.parquet", (time.time() - 60 + 10 * i,) * 2)
    feed = spark.readStream.schema(spark.read.parquet(str(source)).schema).option("maxFilesPerTrigger", 1) \
        .parquet(str(source))
    query = feed.writeStream.foreachBatch(mt.StreamSink(t.path, "cdc", operation_column="op")) \
        .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start()
    query.awaitTermination()
    assert t.to_arrow().sort_by("id").select(["id", "v"]).to_pylist() == [
        {"id": 2, "v": "y"}, {"id": 3, "v": "back"}, {"id": 4, "v": "z"}]
    assert t.apply_changes(spark.createDataFrame(rows([4], "a", "z", 5, op=["d"]).to_pandas())).deleted == 1
