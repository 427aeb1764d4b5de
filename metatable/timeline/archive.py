"""The timeline's archive: completed instants moved out of the active timeline, so that listing and reading
the active timeline costs the same after twenty thousand commits as after a hundred.

Under `.metatable/archive/`:
- `<first>_<last>_<level>.archive`: an Avro container (`avro_schemas/archived_instant.avsc`) of the completed
  instants with times in [first, last], each with its commit metadata. New files are level 0; once `FAN_IN`
  files share a level they are merged into one file of the next level (a tiered LSM: a few dozen files hold
  years of instants, and the levels fall with time, so the files of a level are contiguous);
- `summary.json`: `until`, the newest archived time (every instant at or before it is archived or never
  completed: archival moves only a completed prefix of the timeline), and `carried`, what the timeline's owner
  keeps of the archived instants for readers of the latest snapshot (`ArchiveSummary`).

Archiving a run of instants (under the table lock, idempotent, resumed by the next archival after a crash):
1. write the run's archive file (readers ignore files past `until`);
2. replace the summary: from here on the run is archived;
3. delete the run's state files from the active timeline, oldest first.
A reader lists the active timeline before it reads the summary: whatever a listing concurrent with step 3
missed is at or before the `until` it reads next, so an instant is never in neither place for a reader.
"""
from __future__ import annotations

import io
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import fastavro

from avro_schemas import schema

from metatable.errors import CorruptFileError, InvalidInputError, MissingFileError
from metatable.faults import crash_point
from metatable.storage.base import Storage, is_temporary, read_json, write_json
from metatable.timeline.instant import BOOTSTRAP_TIME, Action, Instant, validate_time

log = logging.getLogger(__name__)

FAN_IN = 10  # archive files of one level merged into one of the next: log(instants) files in all
SUMMARY = "summary.json"
SUFFIX = ".archive"

Content = dict[str, Any]
Carry = Callable[[Content, list[tuple[Instant, Content]]], Content]  # (carried so far, newly archived) -> carried


@dataclass(frozen=True)
class ArchiveFile:
    """One archive file; its name is its serialization."""

    first: str
    last: str
    level: int = 0

    @property
    def file_name(self) -> str:
        return f"{self.first}_{self.last}_{self.level}{SUFFIX}"

    @staticmethod
    def parse(name: str) -> ArchiveFile:
        try:
            first, last, level = name[:-len(SUFFIX)].split("_")
            if not name.endswith(SUFFIX):
                raise ValueError(name)
            return ArchiveFile(validate_time(first), validate_time(last), int(level))
        except (ValueError, InvalidInputError):
            raise InvalidInputError(f"bad archive file name {name!r}: expected <first>_<last>_<level>{SUFFIX}") \
                from None


@dataclass(frozen=True)
class ArchiveSummary:
    """Where the active timeline begins, and what its owner carries of the instants before it."""

    until: str = BOOTSTRAP_TIME
    carried: Content = field(default_factory=dict)

    def holds(self, time: str) -> bool:
        """Whether an instant at `time` is archived (so completed, if it existed at all)."""
        return time <= self.until


class Archive:
    def __init__(self, storage: Storage, directory: str) -> None:
        self.storage = storage
        self.dir = directory

    @property
    def summary_path(self) -> str:
        return os.path.join(self.dir, SUMMARY)

    def summary(self) -> ArchiveSummary:
        try:
            raw = read_json(self.storage, self.summary_path)
        except FileNotFoundError:
            return ArchiveSummary()
        try:
            return ArchiveSummary(validate_time(raw["until"]), dict(raw.get("carried", {})))
        except (KeyError, TypeError, InvalidInputError) as e:
            raise CorruptFileError(self.summary_path, f"not an archive summary ({e}); it says how far the timeline "
                                   "is archived. `metatable fsck TABLE` checks the rest") from None

    def all_files(self) -> list[ArchiveFile]:
        return [ArchiveFile.parse(n) for n in self.storage.list(self.dir) if n.endswith(SUFFIX) and not is_temporary(n)]

    def files(self, until: str) -> list[ArchiveFile]:
        """The archive files that hold the instants at or before `until` once each, oldest first. A merge that
        died leaves its inputs beside its output, which covers them; a file past `until` is an archival that
        died before its summary (the next archival replaces it)."""
        out: list[ArchiveFile] = []
        for f in sorted((f for f in self.all_files() if f.last <= until), key=lambda f: (f.first, -int(f.last))):
            if out and f.first <= out[-1].last:
                continue
            out.append(f)
        return out

    def read(self, first: str = BOOTSTRAP_TIME, last: str | None = None) -> Iterator[tuple[Instant, Content]]:
        """The archived instants with times in [first, last], oldest first, each with its commit metadata.

        An archival in another process may merge files this read listed into one of the next level and delete
        them before the read reaches them: the read lists again and goes on after the last instant it gave
        (the new file holds the same instants). A listed file that is gone with no file that holds its
        instants is lost: a MissingFileError."""
        until = self.summary().until
        last = min(last or until, until)
        given = ""  # the newest time yielded so far
        while True:
            f: ArchiveFile | None = None
            try:
                for f in self.files(until):
                    if f.last < first or f.first > last or f.last <= given:
                        continue
                    for record in self._records(f):
                        if first <= record["time"] <= last and record["time"] > given:
                            given = record["time"]
                            yield Instant(record["time"], Action(record["action"])), json.loads(record["content"])
                return
            except FileNotFoundError:
                if f is None:
                    raise
                if not any(g != f and g.first <= f.first and f.last <= g.last for g in self.files(until)):
                    raise MissingFileError(os.path.join(self.dir, f.file_name), "an archive file listed but absent; "
                                           "it holds the commit metadata of archived instants. Restore it from a "
                                           "backup under the same name") from None
                log.debug("archive file %s merged away while it was read: listing again", f.file_name)

    def find(self, time: str) -> Instant | None:
        """The archived instant at `time`, if any."""
        return next((i for i, _ in self.read(time, time)), None)

    def _records(self, f: ArchiveFile) -> Iterator[Content]:
        path = os.path.join(self.dir, f.file_name)
        try:
            yield from fastavro.reader(io.BytesIO(self.storage.read(path)))
        except (ValueError, EOFError, fastavro.read.SchemaResolutionError) as e:
            raise CorruptFileError(path, f"not an archive file ({e}); it holds the commit metadata of instants "
                                   f"{f.first} to {f.last}. Restore it from a backup under the same name") from None

    # -- writing (under the table lock) ---------------------------------------------------------------
    def append(self, run: list[tuple[Instant, Content]], carry: Carry) -> ArchiveSummary:
        """Steps 1 and 2 for a completed run of instants newer than `until`, oldest first."""
        previous = self.summary()
        for stale in self.all_files():  # what an archival that died before its summary wrote
            if stale.last > previous.until:
                self.storage.delete(os.path.join(self.dir, stale.file_name))
        self._write(ArchiveFile(run[0][0].time, run[-1][0].time), run)
        crash_point("timeline.archive.file")
        summary = ArchiveSummary(run[-1][0].time, carry(previous.carried, run))
        write_json(self.storage, self.summary_path, {"until": summary.until, "carried": summary.carried})
        crash_point("timeline.archive.summary")
        return summary

    def merge_levels(self) -> None:
        """Merge each level's files into one of the next once FAN_IN of them are there. The inputs go after
        the output is written; inputs that a merge which died left behind go first."""
        until = self.summary().until
        covered = set(self.all_files()) - set(self.files(until))
        for f in covered:
            if f.last <= until:
                self.storage.delete(os.path.join(self.dir, f.file_name))
        while True:
            files = self.files(until)
            by_level: dict[int, list[ArchiveFile]] = {}
            for f in files:
                by_level.setdefault(f.level, []).append(f)
            full = next((fs for level, fs in sorted(by_level.items()) if len(fs) >= FAN_IN), None)
            if full is None:
                return
            run = [(Instant(r["time"], Action(r["action"])), json.loads(r["content"]))
                   for f in full for r in self._records(f)]
            self._write(ArchiveFile(full[0].first, full[-1].last, full[0].level + 1), run)
            crash_point("timeline.archive.merge")
            for f in full:
                self.storage.delete(os.path.join(self.dir, f.file_name))
            log.info("merged %d archive files of level %d (%s to %s)", len(full), full[0].level, full[0].first,
                     full[-1].last)

    def _write(self, f: ArchiveFile, run: list[tuple[Instant, Content]]) -> None:
        out = io.BytesIO()
        fastavro.writer(out, schema("archived_instant"),
                        [{"time": i.time, "action": i.action.value, "content": json.dumps(c, sort_keys=True)}
                         for i, c in run], codec="deflate")
        self.storage.makedirs(self.dir)
        self.storage.write_atomic(os.path.join(self.dir, f.file_name), out.getvalue())
