"""How a data table undoes one of its instants (see `transaction.Undo`).

Every data file is marked before it is written, so undoing a pending instant deletes exactly the files
its markers name (even in partitions the metadata table never heard of), then undoes the metadata
deltacommit at the same instant. Completed data instants are never undone. An indexing is undone by
`index_states.undo_indexing`.
"""
from __future__ import annotations

import shutil

from metatable.commit.index_states import undo_indexing
from metatable.commit.schema_history import forget_schema
from metatable.file_group.before_images import remove_images
from metatable.file_group.markers import clear, written_files
from metatable.metadata.table import MetadataTable
from metatable.storage.base import Storage
from metatable.storage.paths import TablePaths
from metatable.timeline.instant import Action, Instant
from metatable.timeline.transaction import Content


class DataUndo:
    def __init__(self, storage: Storage, paths: TablePaths, metadata: MetadataTable) -> None:
        self.storage = storage
        self.paths = paths
        self.metadata = metadata

    def describe(self, target: Instant) -> Content:
        if target.action is Action.INDEXING:
            plan = self.metadata.authority.plan_if_present(target)
            return {"committed": False, "partitions": plan.get("partitions", {})}
        return {"committed": False}

    def undo(self, plan: Content, by: Instant) -> Content:
        if plan.get("action") == Action.INDEXING.value:
            return undo_indexing(self.storage, self.paths, self.metadata, plan, by)
        time = plan["target"]
        files = written_files(self.storage, self.paths, time)
        for relative in files:
            self.storage.delete(f"{self.paths.root}/{relative}")
        self.metadata.rollback(time)
        forget_schema(self.storage, self.paths, time)
        remove_images(self.storage, self.paths, [time])
        shutil.rmtree(self.storage.scratch(self.paths.spill(time)), ignore_errors=True)  # a stream's spilled input
        clear(self.storage, self.paths, time)
        return {"deleted": files}
