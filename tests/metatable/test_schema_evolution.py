"""Schema evolution: columns added and widened through `add_columns` and `schema_mode="merge"`, old files read
with the new schema, every snapshot with its own, refusals that write nothing, concurrent and killed changes."""
from __future__ import annotations

import decimal
import json
import os
import signal
import subprocess
import sys

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metatable as mt
from metatable.errors import InvalidInputError
from metatable.schema_evolution import check_changes, merged_write_schema, widens

from .test_write_concurrency import held_at, release, wait_held

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = pa.schema([("id", pa.int64()), ("p", pa.string()), ("v", pa.int32()), ("f", pa.float32()),
                  ("d", pa.decimal128(5, 2))])


# -- the rules, fixed vectors -------------------------------------------------------------------------------
@pytest.mark.parametrize("source,target,expected", [
    (pa.int8(), pa.int16(), True), (pa.int32(), pa.int64(), True), (pa.int64(), pa.int32(), False),
    (pa.uint8(), pa.int16(), True), (pa.uint32(), pa.int64(), True), (pa.uint64(), pa.int64(), False),
    (pa.int32(), pa.uint64(), False), (pa.float32(), pa.float64(), True), (pa.float64(), pa.float32(), False),
    (pa.int32(), pa.float64(), False), (pa.decimal128(5, 2), pa.decimal128(9, 2), True),
    (pa.decimal128(5, 2), pa.decimal128(9, 3), False), (pa.decimal128(9, 2), pa.decimal128(5, 2), False),
    (pa.string(), pa.large_string(), False), (pa.int64(), pa.int64(), False), (pa.date32(), pa.timestamp("us"), False),
])
def test_widens(source, target, expected):
    assert widens(source, target) is expected


def test_check_changes_adds_and_widens_and_refuses_the_rest():
    fixed = ("id", "p")
    out = check_changes(BASE, [pa.field("c", pa.large_string()), pa.field("v", pa.int64())], fixed)
    assert out.names == [*BASE.names, "c"] and out.field("v").type == pa.int64() and out.field("c").type == pa.string()
    for bad, words in [([pa.field("v", pa.int16())], "not a widening"), ([pa.field("f", pa.string())], "not a widening"),
                       ([pa.field("c", pa.int8(), nullable=False)], "not nullable"),
                       ([pa.field("id", pa.string())], "not a widening"), ([pa.field("c", pa.int8())] * 2, "twice"),
                       ([], "non-empty"), ([pa.field("l", pa.duration("s"))], "does not store")]:
        with pytest.raises(InvalidInputError, match=words):
            check_changes(BASE, bad, fixed)
    with pytest.raises(InvalidInputError, match="record key or partition"):
        check_changes(pa.schema([("id", pa.int32())]), [pa.field("id", pa.int64())], ("id",))


def test_a_merge_adds_new_columns_and_never_widens():
    data = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("new", pa.bool_())])
    merged = merged_write_schema(BASE, data, ("id",))
    assert merged.names == [*BASE.names, "new"] and merged.field("v").type == pa.int32()


# -- through the public API ---------------------------------------------------------------------------------
def rows(ids, v=1, **extra) -> pa.Table:
    ids = list(ids)
    columns = {"id": ids, "p": ["a" if i % 2 else "b" for i in ids],
               "v": pa.array([v] * len(ids), pa.int32() if v < 2 ** 31 else pa.int64()),
               "f": pa.array([0.5] * len(ids), pa.float32()),
               "d": pa.array([decimal.Decimal("1.25")] * len(ids), pa.decimal128(5, 2))}
    columns.update({k: val if isinstance(val, pa.Array) else [val] * len(ids) for k, val in extra.items()})
    return pa.table(columns)


def new_table(path, table_type="merge_on_read", index=None, **kwargs) -> mt.Table:
    return mt.Table.create(str(path), BASE, "id", partition_by="p", ordering_field="v", table_type=table_type,
                           index=index or mt.IndexConfig(num_buckets=2), **kwargs)


def files_under(path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_added_and_widened_columns_read_from_old_and_new_files(tmp_path, table_type):
    t = new_table(tmp_path / "t", table_type)
    first = t.upsert(rows(range(6))).instant
    widened = t.add_columns([pa.field("note", pa.string()), pa.field("v", pa.int64()), pa.field("f", pa.float64()),
                             pa.field("d", pa.decimal128(9, 2))])
    assert widened is not None
    assert t.add_columns([pa.field("note", pa.string())]) is None  # nothing new: no commit
    big = 2 ** 40
    t.upsert(rows([1, 10], v=big, note="new"))
    t.upsert(rows([2]))  # a writer that predates the column: written as null
    got = {r["id"]: r for r in t.to_arrow().to_pylist()}
    assert t.to_arrow().schema.field("v").type == pa.int64()
    assert got[1]["v"] == big and got[1]["note"] == "new" and got[10]["note"] == "new"
    assert got[0]["note"] is None and got[0]["v"] == 1 and got[2]["note"] is None
    assert got[0]["d"] == decimal.Decimal("1.25") and t.to_arrow().schema.field("d").type == pa.decimal128(9, 2)
    old = t.to_arrow(as_of=first)  # a snapshot before the change has its own schema
    assert old.schema.names == BASE.names and old.schema.field("v").type == pa.int32() and old.num_rows == 6
    assert t.get(pa.table({"id": [0, 1], "p": ["b", "a"]})).sort_by("id")["note"].to_pylist() == [None, "new"]
    assert t.to_arrow(filter=[("note", "==", "new")])["id"].to_pylist() in ([1, 10], [10, 1])
    assert sorted(t.to_arrow(filter=[("v", ">", 2 ** 33)])["id"].to_pylist()) == [1, 10]
    t.compact()
    t.cluster()
    assert {r["id"]: r for r in t.to_arrow().to_pylist()} == got
    assert t.to_arrow(as_of=first).schema.names == BASE.names


@pytest.mark.parametrize("index", [mt.IndexConfig(type="bloom"), mt.IndexConfig(type="record"),
                                   mt.IndexConfig(type="bucket", engine="consistent_hashing", num_buckets=2)])
def test_every_index_keeps_working_after_a_merge_write(tmp_path, index):
    indexes = ("column_stats", "bloom_filter") if index.type == "bloom" else ("column_stats",)
    t = new_table(tmp_path / "t", index=index, metadata_indexes=indexes)
    t.upsert(rows(range(20)))
    with pytest.raises(InvalidInputError, match="schema_mode='merge'"):
        t.upsert(rows([5], extra="x"))
    t.upsert(rows([5, 30], v=7, extra="x"), schema_mode="merge")
    assert t.schema.names == [*BASE.names, "extra"]
    keys = pa.table({"id": [5, 30, 6, 99]})
    found = t.lookup(keys)
    assert found["file_id"].null_count == 1  # 99 only
    got = {r["id"]: r for r in t.get(keys).to_pylist()}
    assert set(got) == {5, 6, 30} and got[5]["extra"] == "x" and got[6]["extra"] is None and got[5]["v"] == 7
    assert t.to_arrow().num_rows == 21


def test_a_refused_change_writes_nothing(tmp_path):
    t = new_table(tmp_path / "t")
    t.upsert(rows(range(4)))
    before = files_under(tmp_path / "t")
    config = (tmp_path / "t" / ".metatable" / "table.json").read_text()
    for change in ([pa.field("v", pa.int8())], [pa.field("d", pa.decimal128(4, 2))], [pa.field("f", pa.int64())],
                   [pa.field("p", pa.large_string()), pa.field("q", pa.int8())]):
        if change[0].name == "p":
            assert t.add_columns(change) is not None  # large_string is string: p is unchanged, q added
            continue
        with pytest.raises(InvalidInputError, match="Nothing was written"):
            t.add_columns(change)
        assert files_under(tmp_path / "t") == before
        assert (tmp_path / "t" / ".metatable" / "table.json").read_text() == config
    with pytest.raises(InvalidInputError, match="does not convert|cast it"):
        t.upsert(rows([1]).set_column(2, "v", pa.array(["not a number"])).append_column("q2", pa.array([1])),
                 schema_mode="merge")
    assert "q2" not in mt.Table.open(t.path).schema.names


def test_a_write_that_fails_after_merging_the_schema_leaves_it_unchanged(tmp_path):
    t = new_table(tmp_path / "t")
    t.upsert(rows(range(4)))
    with pytest.raises(InvalidInputError):  # a null key: refused while writing, after the schema was merged
        t.upsert(pa.table({"id": pa.array([None], pa.int64()), "p": ["a"], "v": pa.array([1], pa.int32()),
                           "f": pa.array([1.0], pa.float32()), "d": pa.array([None], pa.decimal128(5, 2)),
                           "extra": ["x"]}), schema_mode="merge")
    assert mt.Table.open(t.path).schema.names == BASE.names
    assert "extra" not in json.loads((tmp_path / "t" / ".metatable" / "table.json").read_text())["schema_history"]


# -- concurrent and killed changes --------------------------------------------------------------------------
CHILD = """
import os, sys, time, pyarrow as pa, metatable as mt
root, column, go = sys.argv[1:4]
t = mt.Table.open(root, options={"heartbeat.interval_s": 0.1})
if go:
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
ids = list(range(1000 + 100 * len(column), 1010 + 100 * len(column)))
data = pa.table({"id": ids, "p": ["a"] * 10, "v": pa.array([1] * 10, pa.int32()),
                 "f": pa.array([0.5] * 10, pa.float32()), "d": pa.array([None] * 10, pa.decimal128(5, 2)),
                 column: [column] * 10})
for i in range(3):
    t.upsert(data, schema_mode="merge") if i != 1 else t.add_columns([pa.field(column + "_added", pa.int64())])
"""


def run_child(root: str, column: str, go: str = "", **env: str) -> subprocess.Popen:
    """A child that adds `column` (three schema changes); with `go`, it waits for `release` once open."""
    return subprocess.Popen([sys.executable, "-c", CHILD, root, column, go], cwd=ROOT_DIR, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": ROOT_DIR, **env})


def test_concurrent_schema_changes_in_separate_processes_all_land(tmp_path):
    t = new_table(tmp_path / "t")
    t.upsert(rows(range(10)))
    go = str(tmp_path / "go")
    procs = [run_child(t.path, column, go) for column in ("x", "yy", "zzz")]
    release(procs, go)
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    fresh = mt.Table.open(t.path)
    assert set(fresh.schema.names) == {*BASE.names, "x", "yy", "zzz", "x_added", "yy_added", "zzz_added"}
    data = {r["id"]: r for r in fresh.to_arrow().to_pylist()}
    assert len(data) == 40
    for column in ("x", "yy", "zzz"):
        base = 1000 + 100 * len(column)
        assert all(data[i][column] == column for i in range(base, base + 10))
        assert all(data[i][c] is None for i in range(base, base + 10) for c in ("x", "yy", "zzz") if c != column)


def test_a_schema_change_killed_before_it_completes_is_not_seen_and_is_undone(tmp_path):
    t = new_table(tmp_path / "t", options={"heartbeat.interval_s": 0.1, "heartbeat.tolerable_misses": 2})
    t.upsert(rows(range(10)))
    proc = run_child(t.path, "x", METATABLE_CRASH_AT="table.commit.schema")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    stored = json.loads((tmp_path / "t" / ".metatable" / "table.json").read_text())
    assert len(stored["schema_history"]) == 1  # recorded, its instant never completed
    fresh = mt.Table.open(t.path)
    assert fresh.schema.names == BASE.names and fresh.to_arrow().num_rows == 10
    import time
    time.sleep(0.5)  # its heartbeat expires
    assert any("rolled back" in done for done in fresh.rollback().values())
    assert json.loads((tmp_path / "t" / ".metatable" / "table.json").read_text())["schema_history"] == {}
    fresh.upsert(rows([1], x="again"), schema_mode="merge")
    assert mt.Table.open(t.path).to_arrow(filter=[("x", "==", "again")])["id"].to_pylist() == [1]


MERGE_WRITER = """
import sys, pyarrow as pa, metatable as mt
from tests.metatable.table_model import SCHEMA
root = sys.argv[1]
t = mt.Table.open(root, options={"heartbeat.interval_s": 0.1, "heartbeat.tolerable_misses": 3})
data = pa.Table.from_pylist([{"id": i, "p": "a", "v": "late", "ts": 9} for i in range(0, 300, 3)], schema=SCHEMA)
t.upsert(data.append_column("tag", pa.array(["new"] * data.num_rows)), schema_mode="merge")
"""


@pytest.mark.slow
def test_a_merge_write_moved_into_a_clustering_that_completed_meanwhile_keeps_its_new_column(tmp_path):
    """The write's logs are re-homed into the clustering's file groups under the commit lock: they are
    read and rewritten there, and must be read with the schema the write adds."""
    from .test_clustering import loaded, reopened

    table, _ = loaded(str(tmp_path / "t"))
    go = tmp_path / "go"
    writer = subprocess.Popen([sys.executable, "-c", MERGE_WRITER, table.path], cwd=ROOT_DIR, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": ROOT_DIR, **held_at("table.write.files", go)})
    wait_held(writer, go)  # the writer has tagged and written its logs
    assert reopened(table).cluster() is not None
    go.touch()
    out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err
    got = {r["id"]: r for r in mt.Table.open(table.path).to_arrow(filter=[("p", "==", "a")]).to_pylist()}
    assert all(got[i]["tag"] == "new" and got[i]["v"] == "late" for i in range(0, 300, 3))
    assert all(got[i]["tag"] is None for i in got if i % 3)


# -- the model: random writes, schema changes and services, every snapshot checked ---------------------------
NEW_COLUMNS = {"c1": pa.string(), "c2": pa.int16(), "c3": pa.float64()}
WIDER = {"v": pa.int64(), "f": pa.float64(), "d": pa.decimal128(12, 2)}
step = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(["upsert", "insert", "delete"]),
              st.lists(st.integers(0, 12), min_size=1, max_size=6, unique=True), st.integers(0, 3),
              st.booleans()),
    st.tuples(st.just("add"), st.sampled_from(sorted(NEW_COLUMNS))),
    st.tuples(st.just("widen"), st.sampled_from(sorted(WIDER))),
    st.tuples(st.just("service"), st.sampled_from(["compact", "cluster", "clean"])),
)


def value(column: str, type_: pa.DataType, i: int, ts: int):
    if pa.types.is_string(type_):
        return f"{column}{i}-{ts}"
    if pa.types.is_decimal(type_):
        return decimal.Decimal(f"{i}.{ts}5")
    if pa.types.is_floating(type_):
        return i + ts / 4
    return i * 10 + ts


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(table_type=st.sampled_from(["merge_on_read", "copy_on_write"]), steps=st.lists(step, min_size=3, max_size=10))
def test_every_snapshot_equals_the_model_with_its_own_schema(tmp_path_factory, table_type, steps):
    path = tmp_path_factory.mktemp("evolve") / "t"
    t = new_table(path, table_type, options={"clean.retain_commits": 50})
    schema, model, history = BASE, {}, []  # history: (instant, schema, rows) of every commit
    for s in steps:
        kind = s[0]
        if kind == "write":
            _, operation, ids, ts, merge = s
            columns = list(schema) + ([pa.field("c1", pa.string())] if merge and "c1" not in schema.names else [])
            data = pa.table({f.name: pa.array([i if f.name == "id" else "a" if f.name == "p" else
                                               value(f.name, f.type, i, ts) for i in ids], f.type) for f in columns})
            data = data.set_column(2, "v", pa.array([ts] * len(ids), schema.field("v").type))  # the ordering field
            if operation == "delete":
                result = t.delete(data.select(["id", "p"]))
                for i in ids:
                    model.pop(i, None)
            else:
                result = getattr(t, operation)(data, schema_mode="merge" if merge else None)
                schema = pa.schema(columns)
                for row in data.to_pylist():
                    if operation == "upsert" and (row["id"] not in model or row["v"] >= model[row["id"]]["v"]) \
                            or row["id"] not in model:
                        model[row["id"]] = row
            instant = result.instant
        elif kind in ("add", "widen"):
            name = s[1]
            field = pa.field(name, NEW_COLUMNS[name] if kind == "add" else WIDER[name])
            instant = t.add_columns([field])
            if instant is None:
                continue
            schema = pa.schema([field if f.name == name else f for f in schema]) if name in schema.names \
                else schema.append(field)
        else:
            instant = getattr(t, s[1])()
            if instant is None or s[1] == "clean":  # a clean is no snapshot to read as of
                continue
        model = {i: {f.name: r.get(f.name) for f in schema} for i, r in model.items()}
        history.append((instant, schema, sorted(model.values(), key=lambda r: r["id"])))
        snapshot = t.to_arrow()
        assert snapshot.schema.names == schema.names
        assert [snapshot.schema.field(f.name).type for f in schema] == schema.types
        assert sorted(snapshot.to_pylist(), key=lambda r: r["id"]) == history[-1][2]
    completed = {i.time for i in t.timeline() if i.is_completed}
    for instant, old_schema, old_rows in history:
        if instant not in completed:
            continue
        old = t.to_arrow(as_of=instant)
        assert old.schema.names == old_schema.names and old.schema.types == old_schema.types, instant
        assert sorted(old.to_pylist(), key=lambda r: r["id"]) == old_rows, instant


# -- through Spark ------------------------------------------------------------------------------------------
def test_spark_reads_and_writes_an_evolved_table(spark, tmp_path):
    t = new_table(tmp_path / "t", "copy_on_write")  # base files only: Spark reads them as Parquet
    first = t.upsert(rows(range(8))).instant
    t.add_columns([pa.field("v", pa.int64()), pa.field("note", pa.string())])
    df = spark.createDataFrame([(20, "a", 2 ** 40, 0.5, decimal.Decimal("2.50"), "hi", True)],
                               "id long, p string, v long, f float, d decimal(5,2), note string, flag boolean")
    df.write.format("metatable").option("schema_mode", "merge").mode("append").save(t.path)
    t.read(spark=spark).collect()  # the session's DataFrame read of old int32 and new int64 files
    got = {r["id"]: r.asDict() for r in t.read(spark=spark).collect()}
    assert got[20]["v"] == 2 ** 40 and got[20]["flag"] is True and got[20]["note"] == "hi"
    assert got[3]["v"] == 1 and got[3]["flag"] is None and len(got) == 9
    source = {r["id"]: r.asDict() for r in spark.read.format("metatable").load(t.path).collect()}
    assert source == got
    old = spark.read.format("metatable").option("as_of", first).load(t.path)
    assert old.columns == BASE.names and old.count() == 8
