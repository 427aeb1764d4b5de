"""Child process for the change-stream test: a writer that keeps upserting, or the streaming query that copies
a table's changes into another through `StreamSink`.

usage: python -m tests.metatable.change_stream_child write ROOT SEED STOP_FILE
       python -m tests.metatable.change_stream_child copy SOURCE TARGET CHECKPOINT
`copy` runs until killed (SIGKILL, or METATABLE_CRASH_AT). The test drains the copy in its own session
(`copy_changes(..., drain=True)`).
"""
from __future__ import annotations

import os
import random
import sys
import time

import pyarrow as pa

import metatable as mt
from metatable.errors import ConflictError
from metatable.read.changes import settled_end

from .table_model import SCHEMA


def write(root: str, seed: int, stop_file: str) -> None:
    """Upserts (and a few deletes) of 40 keys, each row's ordering value its commit number, until `stop_file`
    exists."""
    rng = random.Random(seed)
    table = mt.Table.open(root)
    n = 0
    while not os.path.exists(stop_file):
        n += 1
        ids = rng.sample(range(40), 6)
        rows = pa.Table.from_pylist([{"id": i, "p": "ab"[i % 2], "v": f"w{seed}-{n}", "ts": n} for i in ids],
                                    schema=SCHEMA)
        try:
            if n % 5 == 4:
                table.delete(rows.select(["id", "p"]).slice(0, 2))
            else:
                table.upsert(rows)
        except ConflictError:
            pass  # lost to another writer after its retries: the next commit goes on
        time.sleep(rng.uniform(0.1, 0.5))


def copy_changes(spark, source: str, target: str, checkpoint: str, drain: bool) -> None:
    """The query on `spark`: until killed, or with `drain` until it has read up to the source's settled end (the
    test drains in its own session)."""
    changes = spark.readStream.format("metatable").option("start", "earliest").load(source) \
        .where("_change_type != 'update_preimage'")
    sink = mt.StreamSink(target, "copy", operation_column="_change_type", delete_values=["delete"],
                         sequence_by=["_commit_instant", "_commit_seq"])  # the source's order, not the `ts`
    query = changes.writeStream.foreachBatch(sink) \
        .option("checkpointLocation", checkpoint).trigger(processingTime="500 milliseconds").start()
    if not drain:
        query.awaitTermination()
        return
    end = settled_end(mt.Table.open(source).context.view())
    while not checkpointed(checkpoint, end):
        if query.exception():
            raise query.exception()
        time.sleep(0.5)
    query.stop()


def checkpointed(checkpoint: str, end: str) -> bool:
    """Whether the query's last committed batch (Spark's checkpoint: `offsets/N` written before batch N,
    `commits/N` after it) read up to `end`."""
    def batches(kind: str) -> list[int]:
        folder = os.path.join(checkpoint, kind)
        return sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []
    done = batches("commits")
    if not done or done[-1] != max(batches("offsets")):
        return False
    with open(os.path.join(checkpoint, "offsets", str(done[-1]))) as f:
        return end in f.read().splitlines()[-1]


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        session = mt.spark_session(master="local[2]", shuffle_partitions=2)
        copy_changes(session, sys.argv[2], sys.argv[3], sys.argv[4], drain=False)
        session.stop()
