"""Spark sessions: a local one with the settings metatable relies on, the active one, and schemas between
Arrow and Spark."""
from __future__ import annotations

import os
import sys
from typing import Any

import pyarrow as pa

from metatable.arrow_memory import BULK_POOL

JVM_OPTIONS = "-XX:G1PeriodicGCInterval=2000 -XX:MinHeapFreeRatio=10 -XX:MaxHeapFreeRatio=30"


def spark_session(master: str = "local[2]", app_name: str = "metatable", shuffle_partitions: int = 4,
                  **conf: str):
    """A local SparkSession with settings metatable relies on (Arrow on, UI off, few shuffle partitions)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.sql.session.timeZone", "UTC")
               # measured bulk loads (benchmarks/peers.py data): SF 1 in 37 s either way, peak RSS of all
               # processes 3.2 GB with 2g, 5.0 GB with 4g; SF 10 (80 buckets) 318 s, 3.2 GB with 2g
               .config("spark.driver.memory", "2g")
               # G1 gives heap back to the OS after a collection and when idle (2 s): after an SF 1 load
               # the JVM kept 2.5 GB resident; with these it went down to 0.7 GB within seconds.
               # benchmarks/peers.py, SF 1 MoR bucket, peak RSS of all processes: load 3.47 -> 2.86 GB,
               # upsert 3.49 -> 2.89 GB (it starts right after the load), times within run-to-run noise
               .config("spark.driver.extraJavaOptions", JVM_OPTIONS)
               # Arrow's jemalloc pool in the Python workers: mimalloc's (the default) first growth of a
               # worker's heap faults in huge pages, and the session's first big write paid for it. SF 1
               # load after a small warm-up write: 6.7-6.9 -> 5.5 s; later loads the same either way.
               .config("spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL", BULK_POOL))
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def active_session(spark: Any = None):
    from pyspark.sql import SparkSession

    return spark or SparkSession.getActiveSession() or spark_session()


def is_dataframe(data: object) -> bool:
    return type(data).__name__ == "DataFrame" and hasattr(data, "mapInArrow")


def to_spark_schema(schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def arrow_schema_of(df) -> pa.Schema:
    """A DataFrame's schema as the Arrow batches Spark hands to Python carry it: a `timestamp` column in the
    session's time zone (Spark's instants; a table's UTC timestamps take them as they are), `timestamp_ntz`
    without one."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(df.schema, timezone=df.sparkSession.conf.get("spark.sql.session.timeZone"))
