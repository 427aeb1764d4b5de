"""Every path of a table, defined once.

A data table and a metadata table share one layout under their root: `.metatable/` holds the
timeline, heartbeats, write markers, the lock and the table's properties; a data table's metadata
table lives at `.metatable/metadata/` (a table of its own, with the same layout), or, once rebuilt, in
the directory that the last of `.metatable/metadata_roots/` names. Roots are local directories or
`s3://bucket/prefix` URLs; both join with `os.path.join`. Data files live in
Hive-style partition directories under the root, `.` being the root itself.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from indexes.keys import NON_PARTITIONED

META_DIR = ".metatable"
METADATA_DIR = "metadata"
REBUILT_PREFIX = "metadata-"  # a rebuilt metadata table's directory: `metadata-<instant time>`
SST_CACHE = "sst_cache"


@dataclass(frozen=True)
class TablePaths:
    root: str
    metadata_dir: str = METADATA_DIR  # a data table's: which directory under `.metatable` holds its metadata table

    @property
    def meta(self) -> str:
        return os.path.join(self.root, META_DIR)

    @property
    def table_config(self) -> str:
        """A data table's properties (schema, key, index, options)."""
        return os.path.join(self.meta, "table.json")

    @property
    def properties(self) -> str:
        """A metadata table's properties (partitions and their file-group counts, options)."""
        return os.path.join(self.meta, "properties.json")

    @property
    def lock(self) -> str:
        return os.path.join(self.meta, "lock")

    @property
    def timeline(self) -> str:
        return os.path.join(self.meta, "timeline")

    @property
    def archive(self) -> str:
        """Completed instants moved out of the timeline (`timeline.archive`)."""
        return os.path.join(self.meta, "archive")

    @property
    def last_sweep(self) -> str:
        """When the last sweep of leftovers ran (`commit.leftovers`)."""
        return os.path.join(self.meta, "last_sweep.json")

    @property
    def heartbeats(self) -> str:
        return os.path.join(self.meta, "heartbeats")

    def markers(self, instant: str) -> str:
        return os.path.join(self.meta, "markers", instant)

    @property
    def images_root(self) -> str:
        """Where writes keep before-images (`changes.before_images`), a directory per instant."""
        return os.path.join(self.meta, "images")

    def images(self, instant: str) -> str:
        """The rows a write replaced or deleted as they were before it, one file per file group under its
        partition path: `<images>/<partition path>/<file id>_<token>.log`."""
        return os.path.join(self.images_root, instant)

    def change_file(self, instant: str) -> str:
        """A write's own change records, beside its images (`before_images.write_change_file`)."""
        return os.path.join(self.images(instant), "changes.log")

    def spill(self, instant: str) -> str:
        """Where an in-process write of a stream keeps its input by file group until it writes them."""
        return os.path.join(self.meta, "spill", instant)

    def source_staging(self, token: str) -> str:
        """Where the Spark data source's tasks stage their rows for the driver's commit (`spark_source`)."""
        return os.path.join(self.meta, "spill", f"source-{token}")

    def spooled_input(self, instant: str) -> str:
        """A RecordBatchReader's rows, kept (in the spill) when the write must read them twice."""
        return os.path.join(self.spill(instant), "input.arrow")

    @property
    def metadata(self) -> TablePaths:
        """The paths of a data table's metadata table (the one `metadata_dir` names)."""
        return TablePaths(os.path.join(self.meta, self.metadata_dir))

    @property
    def metadata_roots(self) -> str:
        """Create-only generations, each naming the directory of the metadata table from then on (a rebuild
        adds one: on an object store a directory cannot be renamed); none means `metadata`."""
        return os.path.join(self.meta, "metadata_roots")

    def with_metadata(self, metadata_dir: str) -> TablePaths:
        return dataclasses.replace(self, metadata_dir=metadata_dir)

    @property
    def sst_cache(self) -> str:
        return os.path.join(self.meta, SST_CACHE)

    def partition_dir(self, partition: str) -> str:
        return self.root if partition == NON_PARTITIONED else os.path.join(self.root, partition)

    def file(self, partition: str, name: str) -> str:
        return os.path.join(self.partition_dir(partition), name)

    @staticmethod
    def relative(partition: str, name: str) -> str:
        """A data file's path relative to the root (what a rollback deletes)."""
        return name if partition == NON_PARTITIONED else f"{partition}/{name}"
