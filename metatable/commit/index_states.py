"""The states of a table's metadata indexes, and undoing an indexing.

Each metadata index is `building` (scheduled by the indexer: every commit writes its records, nothing reads
them) or `ready`; a dropped one is absent. The states live in table.json, which commits read under the
table lock, so the table config and not each writer's options decides what writers maintain (unlike Hudi,
where a writer whose config lacked an index deleted the partition, HUDI-5769).

An indexing writes the bases of the partitions it builds (named by its instant) and the logs of the
instants it catches up (their write tokens name it), so undoing it finds exactly its own files: a reset
(its process died) deletes them and the plan runs again; a rollback (aborted, cancelled by a drop, timed
out) also removes the partitions, which a retry schedules afresh.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Sequence

from metatable.config import secondary_partition
from metatable.file_group.base_file import BaseFile
from metatable.formats.log_file import LogFile
from metatable.metadata.file_group import SST_EXTENSION
from metatable.metadata.table import MetadataTable
from metatable.storage.base import Storage, read_json
from metatable.storage.paths import TablePaths
from metatable.table_config import BUILDING, parse_index_states
from metatable.timeline.held_reads import write_held
from metatable.timeline.instant import Action, Instant

log = logging.getLogger(__name__)

BASE_TOKEN = "indexed"  # fixed, so a rerun of the build replaces its bases


def read_states(storage: Storage, paths: TablePaths) -> dict[str, str]:
    return parse_index_states(read_json(storage, paths.table_config)["metadata_indexes"])


def save_states(storage: Storage, paths: TablePaths, states: Mapping[str, str],
                secondary: Mapping[str, Sequence[str]] | None = None) -> None:
    """Replace the states in table.json, atomically (callers hold the table lock), with the definitions of new
    secondary indexes (`secondary`: name -> columns); a secondary index whose partition has no state any more
    loses its definition."""
    stored = read_json(storage, paths.table_config)
    stored["metadata_indexes"] = dict(states)
    definitions = {**stored.get("secondary_indexes", {}), **(secondary or {})}
    stored["secondary_indexes"] = {name: list(columns) for name, columns in definitions.items()
                                   if secondary_partition(name) in states}
    write_held(storage, paths.table_config, stored)


def catch_up_token(instant: str, indexing: str) -> str:
    """The write token of a log that indexing `indexing` writes for instant `instant` (its block's instant)."""
    return f"{instant}-indexing{indexing}"


def is_indexing_file(name: str, indexing: str) -> bool:
    if name.endswith("." + SST_EXTENSION):
        base = BaseFile.parse(name)
        return base.write_token == BASE_TOKEN and base.instant == indexing
    return LogFile.is_log_name(name) and LogFile.parse(name).write_token.endswith(f"-indexing{indexing}")


def undo_indexing(storage: Storage, paths: TablePaths, metadata: MetadataTable, plan: Mapping[str, Any],
                  by: Instant) -> dict[str, Any]:
    """Delete what indexing `plan["target"]` wrote; on behalf of a rollback, also remove the partitions it was
    building (a reset keeps them building: the plan runs again)."""
    indexing = plan["target"]
    partitions = list(plan.get("partitions", {}))
    deleted = []
    for partition in partitions:
        directory = os.path.join(metadata.root, partition)
        for name in storage.list(directory):
            if is_indexing_file(name, indexing):
                storage.delete(os.path.join(directory, name))
                if name.endswith("." + SST_EXTENSION):
                    metadata.layout.sst_cache.forget(name)
                deleted.append(f"{partition}/{name}")
    metadata.reread()
    if by.action is Action.ROLLBACK:
        states = read_states(storage, paths)
        removed = [p for p in partitions if states.get(p) == BUILDING]
        save_states(storage, paths, {p: s for p, s in states.items() if p not in removed})
        for partition in removed:
            metadata.remove_partition(partition)
        log.warning("indexing %s rolled back: partitions %s removed", indexing, removed)
        return {"deleted": deleted, "removed": removed}
    return {"deleted": deleted}
