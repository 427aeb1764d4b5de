"""Reads that select and stream: `to_arrow(columns=, filter=)` with ORed filters and values coerced to the
column's type, `to_batches()` read lazily (DuckDB and Polars take it), and `delete(where=)`; against a model."""
from __future__ import annotations

import datetime as dt
import decimal
import os

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metatable as mt
from metatable.errors import InvalidInputError, MetatableError, MissingFileError, SnapshotExpiredError
from metatable.read.scan_filter import parse_filter

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.date32()), ("amt", pa.decimal128(12, 2)),
                    ("status", pa.string()), ("n", pa.int32())])
DAYS = [dt.date(2024, 1, d) for d in (1, 2, 3)]


def orders(ids, n=0) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": ids, "day": [DAYS[i % 3] for i in ids], "amt": [decimal.Decimal(i) / 4 for i in ids],
                     "status": ["cancelled" if i % 5 == 0 else "open" if i % 2 else "paid" for i in ids],
                     "n": [n] * len(ids)}, schema=SCHEMA)


def new_table(path, table_type="merge_on_read") -> mt.Table:
    t = mt.Table.create(str(path), SCHEMA, "id", partition_by="day", ordering_field="n", table_type=table_type,
                        index=mt.IndexConfig(num_buckets=2))
    t.upsert(orders(range(30)))
    t.upsert(orders(range(0, 30, 3), n=1))  # logs on merge-on-read: slices that column stats cannot skip
    return t


# -- filters, fixed vectors ---------------------------------------------------------------------------------
def test_filters_are_ored_conjunctions_with_values_of_the_columns_type():
    assert parse_filter([("day", "==", "2024-01-02")], SCHEMA) == [[("day", "==", dt.date(2024, 1, 2))]]
    assert parse_filter([[("amt", ">", 3)], [("id", "in", ["1", 2])]], SCHEMA) == \
        [[("amt", ">", decimal.Decimal("3.00"))], [("id", "in", [1, 2])]]
    assert parse_filter(None, SCHEMA) == [] and parse_filter([], SCHEMA) == []
    for bad, words in [([("day", "==", "soon")], "does not convert"), ([("nope", "==", 1)], "not in the table"),
                       ([("id", "~", 1)], "not one of"), ([("id", "in", 5)], "list of values"),
                       ([("id", "==")], "triples"), ([("n", "==", None)], "null"), ("id > 3", "triples")]:
        with pytest.raises(InvalidInputError, match=words):
            parse_filter(bad, SCHEMA)


def test_columns_are_projected_in_the_order_asked(tmp_path):
    t = new_table(tmp_path / "t")
    got = t.to_arrow(columns=["status", "id"], filter=[("day", "==", "2024-01-02")])
    assert got.column_names == ["status", "id"] and sorted(got["id"].to_pylist()) == list(range(1, 30, 3))
    assert t.to_arrow(columns=["n"], filter=[("id", "==", 3)])["n"].to_pylist() == [1]
    with pytest.raises(InvalidInputError, match="distinct columns"):
        t.to_arrow(columns=["id", "nope"])


# -- the model: random rows, filters, projections and deletes -----------------------------------------------
conjunct = st.one_of(
    st.tuples(st.just("id"), st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), st.integers(-1, 31)),
    st.tuples(st.just("day"), st.sampled_from(["==", ">=", "<"]), st.sampled_from(["2024-01-01", "2024-01-02",
                                                                                     "2024-01-03"])),
    st.tuples(st.just("amt"), st.sampled_from(["<", ">="]), st.integers(0, 8)),
    st.tuples(st.just("status"), st.just("in"), st.lists(st.sampled_from(["open", "paid", "cancelled"]), max_size=2)),
)
dnf = st.lists(st.lists(conjunct, min_size=1, max_size=3), min_size=1, max_size=3)
OPS = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
       ">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "in": lambda a, b: a in b}


def matches(row: dict, filters) -> bool:
    def value(column, v):
        return dt.date.fromisoformat(v) if column == "day" else decimal.Decimal(v) if column == "amt" else v
    return any(all(OPS[op](row[c], [value(c, x) for x in v] if op == "in" else value(c, v)) for c, op, v in conj)
               for conj in filters)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("reads")
    return {kind: new_table(root / kind, kind) for kind in ("merge_on_read", "copy_on_write")}


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(kind=st.sampled_from(["merge_on_read", "copy_on_write"]), filters=dnf,
       columns=st.one_of(st.none(), st.lists(st.sampled_from(SCHEMA.names), min_size=1, unique=True)))
def test_filtered_projected_reads_equal_the_model(tables, kind, filters, columns):
    t = tables[kind]
    everything = t.to_arrow().to_pylist()
    expected = sorted(([r[c] for c in columns or SCHEMA.names] for r in everything if matches(r, filters)))
    got = t.to_arrow(columns=columns, filter=filters)
    assert got.column_names == (columns or SCHEMA.names)
    assert sorted(list(r.values()) for r in got.to_pylist()) == expected
    streamed = t.to_batches(columns=columns, filter=filters).read_all()
    assert sorted(list(r.values()) for r in streamed.to_pylist()) == expected


def banded(ids, bands, n=0) -> pa.Table:
    """Orders whose amounts lie in a band of their day's (or one given per id): column stats tell days apart."""
    ids = list(ids)
    return pa.table({"id": ids, "day": [DAYS[i % 3] for i in ids],
                     "amt": [decimal.Decimal(20 * bands.get(i, i % 3) + i % 7) for i in ids],
                     "status": ["open"] * len(ids), "n": [n] * len(ids)}, schema=SCHEMA)


def test_slices_with_logs_are_skipped_where_their_base_and_their_logs_rule_them_out(tmp_path):
    """A merge-on-read slice whose base file's column stats rule a filter out is read only where its logs' live
    rows may match: a log that moves a row into the filter's range keeps it, a log of deletes does not."""
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", partition_by="day", ordering_field="n",
                        index=mt.IndexConfig(num_buckets=1))
    t.upsert(banded(range(30), {}))  # day i % 3: amounts 20 * (i % 3) + 0..6
    t.upsert(banded([3], {3: 2}, n=1))  # a day-1 row (band 0) moves into band 2
    gone = banded([4, 7], {4: 2, 7: 2}, n=1).append_column("op", pa.array(["d", "d"]))
    t.apply_changes(gone, "op", ["d"])  # a day-2 log that only deletes (its rows' amounts in band 2)
    got = t.to_arrow(filter=[("amt", ">=", 40)])
    assert sorted(got["id"].to_pylist()) == sorted([i for i in range(30) if i % 3 == 2] + [3])
    assert t.last_scan["skipped"] == 1  # day 2: band 1 in its base, no live row in its log
    assert sorted(t.to_arrow(filter=[("amt", "<", 20)])["id"].to_pylist()) == [i for i in range(0, 30, 3) if i != 3]
    assert sorted(t.to_arrow(filter=[("amt", ">=", 20), ("amt", "<", 40)])["id"].to_pylist()) == [
        i for i in range(1, 30, 3) if i not in (4, 7)]
    assert t.last_scan["skipped"] == 2  # days 2 and 3 (whose base holds band 2, and no log)
    assert t.to_arrow(filter=[("amt", "<", 20)], read_optimized=True).num_rows == 10  # the base's rows: 3 too


ROWS = st.lists(st.tuples(st.integers(0, 29), st.integers(0, 2)), min_size=1, max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(writes=st.lists(st.tuples(st.sampled_from(["upsert", "delete"]), ROWS), max_size=4), filters=dnf)
def test_reads_of_slices_with_logs_skipped_by_their_stats_equal_the_model(tmp_path_factory, writes, filters):
    """Random upserts that move rows between amount bands and deletes, then random filters: every read equals a
    filter of the model's rows, whichever slices the bases' and logs' ranges skipped."""
    t = mt.Table.create(str(tmp_path_factory.mktemp("logs") / "t"), SCHEMA, "id", partition_by="day",
                        ordering_field="n", index=mt.IndexConfig(num_buckets=2))
    t.upsert(banded(range(30), {}))
    model = {r["id"]: r for r in banded(range(30), {}).to_pylist()}
    for n, (operation, rows) in enumerate(writes, 1):
        bands = dict(rows)
        if operation == "upsert":
            batch = banded(bands, bands, n)
            t.upsert(batch)
            model.update({r["id"]: r for r in batch.to_pylist()})
        else:
            t.delete(pa.table({"id": list(bands), "day": [DAYS[i % 3] for i in bands]}, schema=pa.schema(
                [SCHEMA.field("id"), SCHEMA.field("day")])))
            for i in bands:
                model.pop(i, None)
    expected = sorted(r["id"] for r in model.values() if matches(r, filters))
    assert sorted(t.to_arrow(filter=filters)["id"].to_pylist()) == expected


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(filters=dnf, kind=st.sampled_from(["merge_on_read", "copy_on_write"]))
def test_delete_where_deletes_exactly_the_matching_rows(tmp_path_factory, filters, kind):
    t = new_table(tmp_path_factory.mktemp("delete") / "t", kind)
    before = t.to_arrow().to_pylist()
    result = t.delete(where=filters)
    kept = sorted(r["id"] for r in before if not matches(r, filters))
    assert sorted(t.to_arrow()["id"].to_pylist()) == kept
    assert result.deleted == len(before) - len(kept)


def test_delete_takes_keys_or_a_condition(tmp_path):
    t = new_table(tmp_path / "t")
    for args in ({}, {"keys": orders([1]).select(["id", "day"]), "where": [("id", "==", 1)]}):
        with pytest.raises(InvalidInputError, match="keys or where"):
            t.delete(**args)
    with pytest.raises(InvalidInputError, match="does not convert"):
        t.delete(where=[("day", "==", "yesterday")])
    assert t.to_arrow().num_rows == 30


# -- streaming ----------------------------------------------------------------------------------------------
def test_to_batches_reads_a_slice_only_when_the_consumer_gets_there(tmp_path):
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", partition_by="day", table_type="copy_on_write",
                        index=mt.IndexConfig(num_buckets=1))
    t.upsert(orders(range(30)))
    reader = t.to_batches()
    assert isinstance(reader, pa.RecordBatchReader) and reader.schema == SCHEMA
    first = reader.read_next_batch()
    day = first["day"][0].as_py()
    for fs in t.file_slices().values():  # every other slice's file disappears after the first was read
        if fs.partition != f"day={day}":
            os.remove(os.path.join(t.path, fs.partition, fs.base.file_name))
    with pytest.raises(MetatableError, match="missing|does not exist|No such file"):
        reader.read_all()


def test_duckdb_and_polars_query_the_stream(tmp_path):
    t = new_table(tmp_path / "t")
    reader = t.to_batches(columns=["id", "status", "amt"])  # noqa: F841 (DuckDB finds it by its name)
    got = duckdb.sql("select status, count(*) as n from reader where amt >= 2 group by status order by status")
    expected = {}
    for r in t.to_arrow().to_pylist():
        if r["amt"] >= 2:
            expected[r["status"]] = expected.get(r["status"], 0) + 1
    assert dict(got.fetchall()) == expected
    frame = pl.from_arrow(t.to_batches(columns=["id", "day"], filter=[("day", "==", "2024-01-03")]))
    assert sorted(frame["id"].to_list()) == list(range(2, 30, 3))


def test_a_scan_runs_lazily_in_duckdb_and_polars(tmp_path, caplog):
    t = new_table(tmp_path / "t")
    rows = t.to_arrow().to_pylist()
    s = t.scan(columns=["id", "status", "amt"], filter=[("n", "==", 1)])
    got = duckdb.sql("select status, count(*) as n from s group by status").fetchall()
    expected = {}
    for r in rows:
        if r["n"] == 1:
            expected[r["status"]] = expected.get(r["status"], 0) + 1
    assert dict(got) == expected
    assert pa.table(s).num_rows == sum(expected.values())  # pyarrow through __arrow_c_stream__
    caplog.set_level("DEBUG", logger="metatable.read.scan")
    frame = t.scan().to_polars().filter(pl.col("amt") >= 2).select("id").collect()
    assert sorted(frame["id"].to_list()) == sorted(r["id"] for r in rows if r["amt"] >= 2)
    assert "reading columns ['id', 'amt']" in caplog.text  # Polars' projection reached the read


def test_a_polars_limit_stops_the_read(tmp_path):
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", partition_by="day", table_type="copy_on_write",
                        index=mt.IndexConfig(num_buckets=1))
    t.upsert(orders(range(30)))
    s = t.scan()
    for fs in s.plan.slices[1:]:  # only the first slice can be read
        os.remove(os.path.join(t.path, fs.partition, fs.base.file_name))
    assert s.to_polars().head(2).collect().height == 2
    with pytest.raises(MetatableError, match="missing|does not exist|No such file"):
        s.to_polars().collect()


def test_spark_reads_select_and_filter_the_same(spark, tmp_path):
    t = new_table(tmp_path / "t")
    filters = [[("day", "==", "2024-01-02"), ("n", "==", 1)], [("amt", ">", 6)]]
    df = t.read(spark=spark, columns=["id", "status"], filter=filters)
    assert df.columns == ["id", "status"]
    assert sorted(tuple(r) for r in df.collect()) == sorted(
        tuple(r.values()) for r in t.to_arrow(columns=["id", "status"], filter=filters).to_pylist())


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(filters=dnf, kind=st.sampled_from(["merge_on_read", "copy_on_write"]),
       status=st.sampled_from(["shipped", "open"]), amt=st.one_of(st.none(), st.integers(0, 99)))
def test_update_where_sets_exactly_the_matching_rows(tmp_path_factory, filters, kind, status, amt):
    t = new_table(tmp_path_factory.mktemp("update") / "t", kind)
    before = t.to_arrow().to_pylist()
    assignments = {"status": status, **({"amt": amt} if amt is not None else {})}
    result = t.update(where=filters, set=assignments)
    expected = sorted(({**r, "status": status, **({"amt": decimal.Decimal(amt)} if amt is not None else {})}
                       if matches(r, filters) else r for r in before), key=lambda r: r["id"])
    assert sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"]) == expected
    assert result.updated == sum(matches(r, filters) for r in before) and result.inserted == 0


def test_update_refuses_keys_partitions_unknown_columns_and_bad_values(tmp_path):
    t = new_table(tmp_path / "t")
    before = t.timeline()
    for assignments, words in [({"id": 1}, "record key or partition"), ({"day": "2024-01-01"}, "partition"),
                               ({"nope": 1}, "not columns"), ({"amt": "lots"}, "does not convert"), ({}, "set=")]:
        with pytest.raises(InvalidInputError, match=words):
            t.update(where=[("id", "==", 1)], set=assignments)
    assert t.timeline() == before


@pytest.mark.parametrize("table_type", ["merge_on_read", "copy_on_write"])
def test_a_filter_on_partition_columns_reads_only_their_slices_logs_or_not(tmp_path, table_type):
    """Slices are skipped by their partition's values, read off the path: those with logs too (which column
    stats cannot judge), and a null partition by any condition on its column (a filter never matches null)."""
    schema = pa.schema([("id", pa.int64()), ("day", pa.date32()), ("n", pa.int32()), ("v", pa.string())])
    t = mt.Table.create(str(tmp_path / "t"), schema, "id", ["day", "n"], table_type=table_type,
                        index=mt.IndexConfig(num_buckets=2))
    days = [dt.date(2024, 1, 1) + dt.timedelta(days=d) for d in range(10)]
    rows = pa.table({"id": range(100), "day": [days[i % 10] for i in range(100)],
                     "n": pa.array([None if i % 7 == 0 else i % 3 for i in range(100)], pa.int32()),
                     "v": ["a"] * 100}, schema=schema)
    t.upsert(rows)
    t.upsert(rows.slice(0, 50).set_column(3, "v", pa.array(["b"] * 50)))  # logs in half the file groups (MoR)
    got = t.to_arrow(filter=[("day", "==", "2024-01-03")])
    assert sorted(got["id"].to_pylist()) == [i for i in range(100) if i % 10 == 2]
    assert t.last_scan["skipped"] == t.last_scan["file_slices"] - len(t.scan_plan(filter=[("day", "==", "2024-01-03")]))
    assert {fs.partition for fs in t.scan_plan(filter=[("day", "==", "2024-01-03")])} == \
        {p for p in {fs.partition for fs in t.file_slices().values()} if p.startswith("day=2024-01-03/")}
    assert {fs.partition for fs in t.scan_plan(filter=[("n", ">=", 0)])} == \
        {p for p in {fs.partition for fs in t.file_slices().values()} if not p.endswith("n=__null__")}
    assert sorted(t.to_arrow(filter=[[("n", "==", 1)], [("day", "in", ["2024-01-01"])]])["id"].to_pylist()) == \
        sorted(i for i in range(100) if (i % 7 and i % 3 == 1) or i % 10 == 0)


def test_a_read_overtaken_by_a_clean_says_so_and_a_lost_file_is_still_damage(tmp_path):
    """A scan consumed after a clean removed its snapshot's files (a read slower than the clean's retention):
    a SnapshotExpiredError that says what happened and what to do, not a missing-file report; a file of the
    latest snapshot that is gone is still reported as missing."""
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", partition_by="day", table_type="copy_on_write",
                            options={"clean.retain_commits": 1, "clean.inline": False})
    table.upsert(orders(range(30)))
    scan = table.scan()
    for n in (1, 2):
        table.upsert(orders(range(30), n=n))  # rewrites every file group
    assert table.clean() is not None
    with pytest.raises(SnapshotExpiredError, match=r"a clean removed files of .* while they were read .*"
                                                   r"clean.retain_commits"):
        scan.to_arrow()
    assert table.to_arrow().num_rows == 30
    latest = next(iter(table.file_slices().values()))  # a file the latest snapshot reads
    os.remove(tmp_path / "t" / latest.partition / latest.base.file_name)
    with pytest.raises(MissingFileError, match=latest.base.file_name):
        table.to_arrow()
