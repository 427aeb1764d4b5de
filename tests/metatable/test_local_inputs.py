"""Local data in every form a Python user holds it: pyarrow, pandas, Polars, DuckDB (`arrow_input`). Writes,
lookups, gets and merges take each of them and store what the same rows as a pyarrow Table store."""
from __future__ import annotations

import datetime as dt
import shutil
import tempfile

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

import metatable as mt
from metatable.arrow_input import arrow_data
from metatable.errors import InvalidInputError
from metatable.write.write_input import WriteStream, as_input

from .strategies import operation_strategy
from .table_model import SCHEMA, TableModel, check_counts, sort_rows

FORMS = ("arrow", "pandas", "polars", "duckdb")


def as_form(rows: pa.Table, form: str):
    """`rows` as a user of `form` holds them (DuckDB: a relation, read as a stream)."""
    if form == "pandas":
        return rows.to_pandas()
    if form == "polars":
        return pl.from_arrow(rows)
    if form == "duckdb":
        return duckdb.from_arrow(rows)
    return rows


@settings(max_examples=15, deadline=None)
@given(ops=st.lists(st.tuples(operation_strategy, st.sampled_from(FORMS)), min_size=1, max_size=5))
def test_writes_of_every_form_equal_the_model(ops):
    """Upserts, inserts and deletes, each from a random form of the same rows: the counts and the rows equal
    the model's, and `get` with keys of that form finds what the model holds."""
    root = tempfile.mkdtemp(prefix="mt-forms-")
    try:
        table = mt.Table.create(f"{root}/t", SCHEMA, "id", "p", "ts", table_type="merge_on_read",
                                index=mt.IndexConfig(num_buckets=2), options={"write.chunk_rows": 4})
        model = TableModel(partitioned=True)
        for (operation, rows), form in ops:
            data = pa.Table.from_pylist(rows, schema=SCHEMA)
            data = data.select(["id", "p"]) if operation == "delete" else data
            result = getattr(table, operation)(as_form(data, form))
            check_counts(result, model.apply(operation, rows), table.config, operation)
            assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
            keys = pa.Table.from_pylist(rows, schema=SCHEMA).select(["id", "p"])
            wanted = {(r["p"], r["id"]) for r in rows}
            got = sort_rows(table.get(as_form(keys, form)).to_pylist())
            assert got == [r for r in model.expected() if (r["p"], r["id"]) in wanted]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_pandas_index_is_a_column_only_when_named(tmp_path):
    """A default index, or the unnamed one a filter leaves, is no column (the write would refuse an unknown
    `__index_level_0__`); `set_index("id")` keeps the key."""
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts")
    frame = pd.DataFrame({"id": [1, 2, 3, 4], "p": ["a", "b", "a", "b"], "v": ["w", "x", "y", "z"], "ts": [1] * 4})
    assert t.upsert(frame[frame["p"] == "a"]).inserted == 2  # index [0, 2]
    assert t.upsert(frame.set_index("id")).inserted == 2
    assert sorted(t.to_arrow()["id"].to_pylist()) == [1, 2, 3, 4]
    assert t.lookup(pd.DataFrame({"id": [3]}))["file_id"][0].is_valid


def test_pandas_and_polars_timestamps_land_as_utc(tmp_path):
    """A naive pandas timestamp is UTC (as Arrow and Spark with a UTC session read it); an aware one is
    converted; Polars' microseconds and string views convert to the table's types."""
    schema = pa.schema([("id", pa.string()), ("day", pa.date32()), ("at", pa.timestamp("us", "UTC"))])
    t = mt.Table.create(str(tmp_path / "t"), schema, "id", "day", "at")
    noon = dt.datetime(2026, 3, 1, 12, tzinfo=dt.timezone.utc)
    t.upsert(pd.DataFrame({"id": ["naive"], "day": [noon.date()], "at": [pd.Timestamp("2026-03-01 12:00")]}))
    t.upsert(pd.DataFrame({"id": ["aware"], "day": [noon.date()],
                           "at": [pd.Timestamp("2026-03-01 13:00", tz="Europe/Paris")]}))
    t.upsert(pl.DataFrame({"id": ["polars"], "day": [noon.date()], "at": [noon.replace(tzinfo=None)]}))
    got = {r["id"]: r["at"] for r in t.to_arrow().to_pylist()}
    assert got == {"naive": noon, "aware": noon, "polars": noon}
    assert t.get(pl.DataFrame({"id": ["polars"], "day": [noon.date()]})).num_rows == 1


def test_merge_and_change_feeds_take_dataframes(tmp_path):
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts")
    t.upsert(pd.DataFrame({"id": [1, 2], "p": ["a", "a"], "v": ["x", "x"], "ts": [1, 1]}))
    source = pl.DataFrame({"id": [1, 3], "p": ["a", "a"], "v": ["m", "n"], "ts": [2, 2]})
    result = t.merge(source, matched_update=True, not_matched_insert=True)
    assert (result.updated, result.inserted) == (1, 1)
    feed = duckdb.sql("select 2::bigint as id, 'a' as p, null::varchar as v, 3::bigint as ts, 'd' as op")
    assert t.apply_changes(feed, "op", ["d"]).deleted == 1
    assert sorted((r["id"], r["v"]) for r in t.to_arrow().to_pylist()) == [(1, "m"), (3, "n")]


def test_streams_stay_streams_and_frames_become_tables(tmp_path):
    """A DuckDB relation or a RecordBatchReader is read as a stream (`write.chunk_rows` at a time: a large
    one is never held whole); a DataFrame, already in memory, is one table."""
    relation = duckdb.sql("select i::bigint as id, 'p' || (i % 3)::varchar as p, 'v' as v, 1::bigint as ts "
                          "from range(5000) r(i)")
    assert isinstance(as_input(relation), WriteStream)
    assert isinstance(as_input(pa.RecordBatchReader.from_stream(pl.DataFrame({"id": [1]}))), WriteStream)
    assert isinstance(as_input(pd.DataFrame({"id": [1]})), pa.Table)
    assert isinstance(arrow_data(pl.DataFrame({"id": [1]})), pa.RecordBatchReader)
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts", options={"write.chunk_rows": 1000})
    assert t.bulk_insert(relation).inserted == 5000
    assert t.to_arrow().num_rows == 5000


def test_what_is_not_local_data_is_named(tmp_path):
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts")
    with pytest.raises(InvalidInputError, match="pandas or Polars DataFrame.*got list"):
        t.upsert([{"id": 1, "p": "a", "v": "x", "ts": 1}])
    with pytest.raises(InvalidInputError, match="ChunkedArray exports an Arrow stream that pyarrow cannot read "
                                                "as rows"):
        t.upsert(pa.chunked_array([[1, 2]]))
    with pytest.raises(InvalidInputError, match="lookup keys must be .*got dict"):
        t.get({"id": [1], "p": ["a"]})
    with pytest.raises(InvalidInputError, match=r"lacks columns \['ts'\]"):
        t.upsert(pd.DataFrame({"id": [1], "p": ["a"], "v": ["x"]}))
    assert t.timeline() == [], "nothing was written"


def test_pandas_round_trip(tmp_path):
    """What a pandas user writes, `to_pandas` gives back (the table's column order, its rows filtered and
    projected as `to_arrow`'s), and a scan does too."""
    t = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", "ts")
    frame = pd.DataFrame({"id": [3, 1, 2], "p": ["b", "a", "b"], "v": ["z", None, "y"], "ts": [1, 1, 1]})
    t.upsert(frame)
    back = t.to_pandas().sort_values("id").reset_index(drop=True)
    pd.testing.assert_frame_equal(back, frame.sort_values("id").reset_index(drop=True))
    assert t.to_pandas(filter=[("p", "==", "b")], columns=["id"])["id"].sort_values().tolist() == [2, 3]
    assert t.scan(columns=["v"], filter=[("id", "==", 1)]).to_pandas()["v"].tolist() == [None]
