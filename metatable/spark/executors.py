"""What a cluster's executors need from the driver: the project's own packages, when their Python cannot
import them (machines where the project is not installed). Local sessions share the driver's environment
and are never probed."""
from __future__ import annotations

import logging
import os
import tempfile
import zipfile
from importlib import import_module
from typing import Any

log = logging.getLogger(__name__)

PACKAGES = ("metatable", "indexes", "avro_schemas")


def missing_on_executors(spark: Any) -> list[str]:
    """The packages some executor's Python cannot import: one small task per core, each a function
    shipped by value (it imports nothing of ours)."""
    def missing(_: Any, packages: tuple[str, ...] = PACKAGES) -> list[str]:
        import importlib.util
        return [p for p in packages if importlib.util.find_spec(p) is None]

    tasks = max(1, spark.sparkContext.defaultParallelism)
    found = spark.sparkContext.parallelize(range(tasks), tasks).flatMap(missing).distinct().collect()
    return sorted(found)


def ship_packages(spark: Any) -> str | None:
    """On a cluster, zip the packages executors lack and add them to their Python path (`addPyFile`);
    returns the archive, or None when nothing had to be shipped."""
    if spark.sparkContext.master.startswith("local"):
        return None
    lacking = missing_on_executors(spark)
    if not lacking:
        return None
    archive = os.path.join(tempfile.mkdtemp(prefix="metatable-ship-"), "metatable-packages.zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        for package in PACKAGES:
            root = os.path.dirname(import_module(package).__file__)
            for directory, subdirs, names in os.walk(root):
                subdirs[:] = [d for d in subdirs if d != "__pycache__"]
                for name in names:
                    path = os.path.join(directory, name)
                    out.write(path, os.path.join(package, os.path.relpath(path, root)))
    spark.sparkContext.addPyFile(archive)
    log.warning("the executors' Python cannot import %s: shipped %s (%d KB) to them", ", ".join(lacking), archive,
                os.path.getsize(archive) // 1024)
    return archive
