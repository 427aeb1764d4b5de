"""The `orders` workflow end to end, as a notebook would run it, checked against a plain Python model at the end.

1. An `orders` table: keyed by `order_id`, partitioned by `order_date`, `updated_at` (a UTC timestamp) as the
   ordering field, a decimal amount. A first load.
2. Change batches: conditional merges (an order that is delivered no longer changes; cancellations delete),
   and a delete by condition.
3. Lazy queries: DuckDB and Polars over `to_batches` (projection and filter pushed into metatable's read).
4. Spark SQL over a temporary view.
5. A change-feed stream (Spark structured streaming, an operation column) with inserts, updates and deletes.

    python examples/orders.py [--orders 5000] [--days 30] [--workdir DIR]
"""
from __future__ import annotations

import argparse
import datetime as dt
import decimal
import os
import random
import sys
import tempfile

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

import metatable as mt

SCHEMA = pa.schema([("order_id", pa.int64()), ("order_date", pa.date32()), ("customer", pa.string()),
                    ("status", pa.string()), ("amount", pa.decimal128(12, 2)),
                    ("updated_at", pa.timestamp("us", tz="UTC"))])
START = dt.date(2026, 10, 1)
EPOCH = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)


def orders(ids: list[int], days: int, version: int, rng: random.Random, status: str | None = None) -> pa.Table:
    return pa.Table.from_pylist([{
        "order_id": i, "order_date": START + dt.timedelta(days=i % days), "customer": f"c{i % 97}",
        "status": status or rng.choice(["open", "paid", "shipped", "delivered"]),
        "amount": decimal.Decimal(rng.randrange(100, 100000)) / 100,
        "updated_at": EPOCH + dt.timedelta(minutes=version, seconds=i % 60)} for i in ids], schema=SCHEMA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=5000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="orders-")
    rng = random.Random(7)
    model: dict[int, dict] = {}

    def apply(rows: pa.Table) -> None:
        for r in rows.to_pylist():
            model[r["order_id"]] = r

    # 1. the table and a first load
    path = os.path.join(workdir, "orders")
    t = mt.Table.create(path, SCHEMA, record_key="order_id", partition_by="order_date", ordering_field="updated_at",
                        index=mt.IndexConfig(type="bucket", num_buckets=2))
    load = orders(list(range(args.orders)), args.days, 0, rng)
    r = t.bulk_insert(load)
    apply(load)
    print(f"loaded {r.inserted} orders into {len(t.partitions())} daily partitions")

    # 2. change batches: a conditional merge each, then a delete by condition
    next_id = args.orders
    for version in range(1, 4):
        changed = rng.sample(range(next_id), args.orders // 10)
        new = list(range(next_id, next_id + args.orders // 20))
        next_id += len(new)
        batch = orders(changed + new, args.days, version, rng)
        ops = ["cancel" if rng.random() < 0.05 else "change" for _ in range(batch.num_rows)]
        source = batch.append_column("op", pa.array(ops))
        r = t.merge(source, matched_delete=[("op", "==", "cancel")],
                    matched_update=[("target.status", "!=", "delivered")],
                    not_matched_insert=[("op", "!=", "cancel")])
        for row, op in zip(batch.to_pylist(), ops):
            current = model.get(row["order_id"])
            if current is not None and op == "cancel":
                del model[row["order_id"]]
            elif current is not None and current["status"] != "delivered":
                model[row["order_id"]] = row
            elif current is None and op != "cancel":
                model[row["order_id"]] = row
        print(f"merge {version}: {r.inserted} inserted, {r.updated} updated, {r.deleted} deleted, "
              f"{r.skipped} left alone (delivered, or a cancel of an unknown order)")
    old_day = START + dt.timedelta(days=1)
    r = t.delete(where=[("status", "==", "open"), ("order_date", "<=", old_day.isoformat())])
    for key in [k for k, v in model.items() if v["status"] == "open" and v["order_date"] <= old_day]:
        del model[key]
    print(f"deleted {r.deleted} open orders of {old_day} and before")

    # 3. lazy queries: only the columns asked for are read, and column stats skip file slices
    duckdb.register("delivered", t.to_batches(columns=["order_date", "amount"], filter=[("status", "==", "delivered")]))
    by_day = duckdb.sql("SELECT order_date, sum(amount) AS total FROM delivered GROUP BY 1 ORDER BY 1").to_arrow_table()
    expected = sum(v["amount"] for v in model.values() if v["status"] == "delivered")
    assert sum(by_day["total"].to_pylist()) == expected, "DuckDB's sum differs from the model's"
    print(f"DuckDB: delivered amounts on {by_day.num_rows} days, {expected} in all")
    top = (pl.from_arrow(t.to_batches(columns=["customer", "amount"])).lazy().group_by("customer")
           .agg(pl.col("amount").sum()).sort("amount", descending=True).head(3).collect())
    print(f"Polars: the three largest customers: {', '.join(top['customer'].to_list())}")

    # 4. Spark SQL
    spark = mt.spark_session()
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW orders USING metatable OPTIONS (path '{path}')")
    counted = {row["status"]: row["n"] for row in
               spark.sql("SELECT status, count(*) AS n FROM orders GROUP BY status").collect()}
    want = {}
    for v in model.values():
        want[v["status"]] = want.get(v["status"], 0) + 1
    assert counted == want, f"Spark SQL counts {counted}, the model {want}"
    print(f"Spark SQL: orders by status {dict(sorted(counted.items()))}")

    # 5. a change feed as a stream: each micro-batch one commit of upserts and deletes, applied once
    feed = os.path.join(workdir, "feed")
    os.makedirs(feed)
    for n in range(3):
        ids = rng.sample(sorted(model), 50) + list(range(next_id, next_id + 20))
        next_id += 20
        batch = orders(ids, args.days, 10 + n, rng)
        ops = ["d" if i in model and rng.random() < 0.3 else "u" for i in ids]
        pq.write_table(batch.append_column("op", pa.array(ops)), os.path.join(feed, f"{n}.parquet"))
        for row, op in zip(batch.to_pylist(), ops):
            if op == "d":
                model.pop(row["order_id"], None)
            else:
                model[row["order_id"]] = row
    stream = spark.readStream.schema(spark.read.parquet(feed).schema).option("maxFilesPerTrigger", 1).parquet(feed)
    query = stream.writeStream.foreachBatch(mt.StreamSink(path, "orders-feed", operation_column="op")) \
        .option("checkpointLocation", os.path.join(workdir, "checkpoint")).trigger(availableNow=True).start()
    query.awaitTermination()
    print(f"stream: {len(os.listdir(feed))} change files applied")

    # the table holds exactly what the model says
    got = {r["order_id"]: r for r in mt.Table.open(path).to_arrow().to_pylist()}
    if got != model:
        wrong = sorted(k for k in got.keys() | model.keys() if got.get(k) != model.get(k))
        sys.exit(f"the table differs from the model on {len(wrong)} orders, such as {wrong[:5]}")
    print(f"checked: {len(got)} orders, equal to the model")


if __name__ == "__main__":
    main()
