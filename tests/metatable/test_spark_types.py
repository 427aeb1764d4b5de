"""Spark's types round-trip through every Spark write path: `Table.upsert(df)` (one task and shuffled),
`format("metatable")`, a `StreamSink` stream and the CLI's `--spark`, whatever the session's time zone; lists,
structs and maps too."""
from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import metatable as mt
from metatable import cli

UTC = dt.timezone.utc
SCHEMA = pa.schema([
    ("id", pa.int64()), ("p", pa.string()), ("ts", pa.timestamp("us", tz="UTC")), ("local", pa.timestamp("us")),
    ("d", pa.date32()), ("amount", pa.decimal128(12, 2)), ("blob", pa.binary()), ("ok", pa.bool_()), ("x", pa.float64()),
    ("tags", pa.list_(pa.string())), ("addr", pa.struct([("city", pa.string()), ("zip", pa.int32())])),
    ("attrs", pa.map_(pa.string(), pa.int64())),
])


def rows(ids: range, version: int) -> pa.Table:
    return pa.Table.from_pylist([{
        "id": i, "p": f"p{i % 3}", "ts": dt.datetime(2024, 3, 10, 1, 30, tzinfo=UTC) + dt.timedelta(hours=i, seconds=version),
        "local": dt.datetime(2024, 2, 10, 2, 30) + dt.timedelta(minutes=i), "d": dt.date(2024, 1, 1) + dt.timedelta(days=i),
        "amount": decimal.Decimal(f"{i}.{version:02d}"), "blob": bytes([i % 256, version]) if i % 5 else None,
        "ok": i % 2 == 0, "x": i / 3 + version, "tags": [f"t{i}", f"v{version}"] if i % 4 else None,
        "addr": {"city": f"c{i}", "zip": version} if i % 3 else None, "attrs": [("n", i), ("v", version)]}
        for i in ids], schema=SCHEMA)


@pytest.fixture(params=["UTC", "America/New_York"])
def session(spark, request):
    """The test session in the given time zone (a `timestamp` column's batches come in it)."""
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", request.param)
    yield spark
    spark.conf.set("spark.sql.session.timeZone", before)


def new_table(tmp_path, name: str, **options) -> mt.Table:
    return mt.Table.create(str(tmp_path / name), SCHEMA, ["id"], ["p"], "ts",
                           index=mt.IndexConfig(type="bucket", num_buckets=2), options=options)


def assert_holds(table: mt.Table, *batches: pa.Table) -> None:
    expected = {r["id"]: r for batch in batches for r in batch.to_pylist()}
    got = mt.Table.open(table.path).to_arrow()
    assert got.schema == SCHEMA
    assert sorted(got.to_pylist(), key=lambda r: r["id"]) == [expected[k] for k in sorted(expected)]


def test_table_upsert_of_a_dataframe(session, tmp_path):
    for options in ({}, {"write.spark_one_task_bytes": 0}):  # one task; tagged and shuffled
        table = new_table(tmp_path, f"t{len(options)}", **options)
        table.upsert(session.createDataFrame(rows(range(20), 1)))
        table.upsert(session.createDataFrame(rows(range(10, 30), 2)))
        assert_holds(table, rows(range(20), 1), rows(range(10, 30), 2))


def test_the_data_source_write(session, tmp_path):
    table = new_table(tmp_path, "t")
    session.createDataFrame(rows(range(20), 1)).write.format("metatable").option("operation", "upsert") \
        .mode("append").save(table.path)
    assert_holds(table, rows(range(20), 1))
    read = session.read.format("metatable").load(table.path).toArrow()
    assert sorted(read.cast(SCHEMA).to_pylist(), key=lambda r: r["id"]) == rows(range(20), 1).to_pylist()


def test_a_stream_through_the_sink(spark, tmp_path):
    session = spark  # the session's time zone matters on the paths above; the stream and the CLI write through them
    table = new_table(tmp_path, "t")
    source = tmp_path / "incoming"
    source.mkdir()
    pq.write_table(rows(range(15), 1), source / "0.parquet")
    pq.write_table(rows(range(5, 25), 2), source / "1.parquet")
    stream = session.readStream.schema(session.read.parquet(str(source)).schema).option("maxFilesPerTrigger", 1) \
        .parquet(str(source))
    query = stream.writeStream.foreachBatch(mt.StreamSink(table.path, "incoming")) \
        .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start()
    query.awaitTermination()
    assert_holds(table, rows(range(15), 1), rows(range(5, 25), 2))


def test_the_cli_with_spark(spark, tmp_path, capsys):
    table = new_table(tmp_path, "t")
    pq.write_table(rows(range(12), 3), tmp_path / "batch.parquet")
    cli.main(["upsert", table.path, str(tmp_path / "batch.parquet"), "--spark"])
    assert "12 inserted" in capsys.readouterr().out
    assert_holds(table, rows(range(12), 3))
