"""Child process for the streaming test: a file-source query into a table through `StreamSink`.

usage: python -m tests.metatable.stream_child ROOT SOURCE_DIR CHECKPOINT_DIR
Processes every file there (one per micro-batch) and stops; METATABLE_CRASH_AT kills it mid-stream.
"""
from __future__ import annotations

import sys

import metatable as mt


def copy_files(spark, root: str, source: str, checkpoint: str) -> None:
    """The query, run until every file is processed (the test restarts it in its own session)."""
    stream = spark.readStream.schema("id long, p string, v string, ts long").option("maxFilesPerTrigger", 1) \
        .json(source)
    query = stream.writeStream.foreachBatch(mt.StreamSink(root, "orders")) \
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()


def main() -> None:
    root, source, checkpoint = sys.argv[1:4]
    spark = mt.spark_session(master="local[2]", shuffle_partitions=2)
    copy_files(spark, root, source, checkpoint)
    spark.stop()


if __name__ == "__main__":
    main()
