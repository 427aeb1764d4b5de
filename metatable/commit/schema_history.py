"""The table's schema versions, in table.json: recorded by the commit of a write that changes the schema.

A schema change is part of a commit (`Table.add_columns` commits one without files; `schema_mode="merge"`
the write's own): under the table lock, before the instant completes, its new schema is added to
table.json's `schema_history` under the instant's time. A version counts once its instant has completed
(`TableConfig.as_seen`), so a commit that dies after recording it changes nothing, and its rollback removes
the entry. Each snapshot reads with the newest version it sees, which is how time travel returns each
version's own schema. Two schema changes never complete out of their instants' order (the later-started
one that would finish first wins; the other retries as a conflict), so the newest visible version always
holds every earlier change.
"""
from __future__ import annotations

import logging

import pyarrow as pa

from metatable.errors import ConflictError
from metatable.schema_evolution import evolve, widens
from metatable.storage.base import Storage, read_json
from metatable.storage.paths import TablePaths
from metatable.table_config import TableConfig, encode_schema
from metatable.timeline.held_reads import write_held
from metatable.timeline.instant import Instant
from metatable.timeline.timeline import Timeline

log = logging.getLogger(__name__)


def record_schema(storage: Storage, paths: TablePaths, config: TableConfig, timeline: Timeline, instant: Instant,
                  written: pa.Schema) -> None:
    """Under the lock, in the commit of `instant`, whose files were written with `written`: add the table's
    schema evolved by `written` as a version named by the instant, unless it holds nothing new. A schema change
    that completed meanwhile from a later instant, or one that retyped a column this write wrote, is a
    conflict: the write runs again from a snapshot with that schema."""
    stored = read_json(storage, paths.table_config)
    config = config.with_stored(stored)
    completed = {i.time for i in timeline.instants() if i.is_completed}
    later = [t for t, _ in config.schema_versions[1:] if t > instant.time and t in completed]
    if later:
        raise ConflictError(f"a schema change committed at {later[-1]} while write {instant.time} changed the "
                            "schema too")
    archived = timeline.archived
    current = config.as_seen(lambda t: t in completed or archived.holds(t)).schema
    final = evolve(current, written, (*config.record_key, *config.partition_by), what=f"write {instant.time}")
    retyped = [f.name for f in written if f.type != final.field(f.name).type
               and not widens(f.type, final.field(f.name).type)]
    if retyped:
        raise ConflictError(f"a schema change committed meanwhile gave columns {retyped} other types than write "
                            f"{instant.time} wrote")
    if final.equals(current):
        return
    stored.setdefault("schema_history", {})[instant.time] = encode_schema(final)
    write_held(storage, paths.table_config, stored)
    log.info("instant %s changes the schema of %s: %s", instant.time, paths.root,
             ", ".join(f"{f.name} {f.type}" for f in final
                       if f.name not in current.names or current.field(f.name).type != f.type))


def forget_schema(storage: Storage, paths: TablePaths, time: str) -> None:
    """Under the lock, undoing instant `time`: remove the schema version it recorded, if any."""
    stored = read_json(storage, paths.table_config)
    if time in stored.get("schema_history", {}):
        del stored["schema_history"][time]
        write_held(storage, paths.table_config, stored)
