"""Every path of a table, defined once.

A data table and a metadata table share one layout under their root: `.metatable/` holds the
timeline, heartbeats, write markers, the lock and the table's properties; a data table's metadata
table lives at `.metatable/metadata/` (a table of its own, with the same layout). Data files live in
Hive-style partition directories under the root, `.` being the root itself.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from indexes.keys import NON_PARTITIONED

META_DIR = ".metatable"
SST_CACHE = "sst_cache"


@dataclass(frozen=True)
class TablePaths:
    root: str

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
        """The paths of a data table's metadata table."""
        return TablePaths(os.path.join(self.meta, "metadata"))

    @property
    def metadata_rebuild(self) -> TablePaths:
        """Where `metatable metadata rebuild` builds the new metadata table before swapping it in."""
        return TablePaths(os.path.join(self.meta, "metadata.rebuild"))

    def metadata_damaged(self, time: str) -> TablePaths:
        """Where a rebuild moves the metadata table it replaces (kept for inspection; delete it at will)."""
        return TablePaths(os.path.join(self.meta, f"metadata.damaged-{time}"))

    @property
    def rebuilt_marker(self) -> str:
        """In a rebuilt metadata table: written once it is complete, so a crashed swap can be finished."""
        return os.path.join(self.meta, "rebuilt")

    @property
    def sst_cache(self) -> str:
        return os.path.join(self.meta, SST_CACHE)

    def partition_dir(self, partition: str) -> str:
        return self.root if partition == NON_PARTITIONED else os.path.join(self.root, partition)

    def file(self, partition: str, name: str) -> str:
        return os.path.join(self.partition_dir(partition), name)

    @staticmethod
    def relative(partition: str, name: str) -> str:
        """A data file's path relative to the root (how markers name it)."""
        return name if partition == NON_PARTITIONED else f"{partition}/{name}"
