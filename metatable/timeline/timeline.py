"""The timeline: one file per instant state under `<root>/.metatable/timeline/`.

State files appear atomically; new instant times are strictly increasing and are
only made under the table lock; inflight writers keep a heartbeat.
"""
from __future__ import annotations

import io
import json
import datetime as dt
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import fastavro

from avro_schemas import schema

from metatable.errors import InvalidInputError, TimelineError, after_the_commit_point
from metatable.faults import crash_point
from metatable.storage.base import Storage, is_temporary
from metatable.storage.cache import SizedCache
from metatable.storage.paths import TablePaths
from metatable.timeline.archive import Archive, ArchiveSummary, Carry, Content
from metatable.timeline.heartbeat import Heartbeat, is_expired
from metatable.timeline.instant import Action, Instant, State, next_time, time_from_datetime, validate_time
from metatable.timeline.lock import Decision, TableLock, quiet_generation, released_as, table_lock

log = logging.getLogger(__name__)

_STATE_RANK = {State.REQUESTED: 0, State.INFLIGHT: 1, State.COMPLETED: 2}
AVRO_PLANS = {Action.REPLACECOMMIT: "clustering_plan"}  # requested plans kept as Avro (avro_schemas/); others JSON


FUTURE_ALLOWANCE = dt.timedelta(hours=1)  # how far ahead of this clock another writer's may be
LISTINGS = 5  # listings of the timeline before a state gap is refused
_held_listings: dict[str, tuple[int, list[str]]] = {}  # timeline directory -> (the lock's epoch, its listing):
# shared by every Timeline object of the directory in this process, so that all see the holder's changes
_quiet_listings: dict[str, tuple[tuple[str, int], list[str]]] = {}  # timeline directory -> ((lock path, quiet
# generation), its listing taken at that generation)
_written: SizedCache[bytes] = SizedCache(1 << 20)  # an inflight or completed state file on an object store ->
# what this process wrote to it: it is created once, and deleted (`_delete`) before it is made again


@dataclass(frozen=True)
class Completion:
    """An instant's completion, prepared on its timeline (`Timeline.completion`) and made by a fence."""

    timeline: Timeline
    instant: Instant  # in its completed state
    decision: Decision


class Timeline:
    def __init__(self, storage: Storage, root: str, lock: TableLock | None = None,
                 heartbeat_interval_s: float = 5.0, heartbeat_misses: int = 6) -> None:
        paths = TablePaths(root)
        self.storage = storage
        self.root = root
        self.dir = paths.timeline
        self.heartbeat_dir = paths.heartbeats
        self.archive = Archive(storage, paths.archive)
        self.lock = lock or table_lock(storage, paths.lock)
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_misses = heartbeat_misses
        # the last listing that passed its checks, its instants and the archive's summary read after it: a write
        # lists the timeline dozens of times, mostly unchanged, so an equal listing is not parsed again (and
        # the summary read then still holds: an archival deletes instants only after it replaced the summary)
        self._last_listing: tuple[list[str], list[Instant], ArchiveSummary] | None = None
        self._ages: tuple[int | None, dict[str, float]] | None = None  # (the lock's tenure, heartbeat ages)

    # -- reading -------------------------------------------------------------------------------
    def instants(self) -> list[Instant]:
        """Each instant of the active timeline in its latest state, oldest first (`archived` holds the
        instants before it). Refused with a TimelineError naming the file: one dated
        in the future (beyond FUTURE_ALLOWANCE of clock skew: taken as real, it would date every later instant
        after it), and a state without the states before it (every instant is requested, then started, then
        completed, and its files are removed latest first, so only a forged or half-copied one lacks them). A
        listing taken while another process removes an instant may miss some of its files and not others, so
        such a gap is listed again before it is refused."""
        for attempt in range(1, LISTINGS + 1):
            names = self._names() if attempt == 1 else self.storage.list(self.dir)
            cached = self._last_listing
            if cached is not None and cached[0] == names:
                return list(cached[1])
            latest, gap = self._listing(names)
            if gap is None:
                # read after the listing (see the module docstring of `archive`); the one read after the last
                # listing still holds when that listing had an active instant and no file of it is gone: an
                # archival moves a prefix of the active timeline, replaces the summary first and removes the
                # instants oldest first, so it archived nothing newer than an instant still listed. With no
                # active instant then, instants made since may have been archived since: a process that listed
                # an empty timeline saw none of them (the chaos run's consistent-hashing compaction then wrote
                # a partition's initial ring again over its resized one)
                summary = cached[2] if cached is not None and cached[1] and set(cached[0]) <= set(names) else \
                    self.archive.summary()
                # an instant at or before `until` is archived (its state files not yet removed)
                instants = [i for i in sorted(latest.values()) if not summary.holds(i.time)]
                self._last_listing = (names, instants, summary)
                return list(instants)
            if attempt < LISTINGS:
                time.sleep(0.01 * attempt)
        raise TimelineError(f"timeline file {os.path.join(self.dir, gap[0].file_name)} has no {gap[1].value} state "
                            "before it: a forged or half-copied instant. Move it out of the timeline (or restore its "
                            "missing state files); nothing of it was read")

    def _listing(self, names: list[str]) -> tuple[dict[tuple[str, Action], Instant], tuple[Instant, State] | None]:
        """The latest state of each instant in one directory listing, and an instant lacking an earlier state."""
        latest: dict[tuple[str, Action], Instant] = {}
        states: dict[tuple[str, Action], set[State]] = {}
        horizon = time_from_datetime(dt.datetime.now(dt.timezone.utc) + FUTURE_ALLOWANCE)
        for name in names:
            if is_temporary(name) or name.startswith("."):
                continue
            try:
                instant = Instant.parse(name)
            except InvalidInputError as e:
                raise TimelineError(f"{e} in {self.dir}; move the stray file out of the timeline") from None
            if instant.time > horizon:
                raise TimelineError(f"timeline file {os.path.join(self.dir, name)} is dated {instant.time}, later than "
                                    f"now plus {FUTURE_ALLOWANCE} of clock skew: a forged or misplaced file (or a "
                                    "clock far behind). Move it out of the timeline; nothing of it was read")
            key = (instant.time, instant.action)
            states.setdefault(key, set()).add(instant.state)
            if key not in latest or _STATE_RANK[instant.state] > _STATE_RANK[latest[key].state]:
                latest[key] = instant
        for key, instant in latest.items():
            for state, rank in _STATE_RANK.items():
                if rank < _STATE_RANK[instant.state] and state not in states[key]:
                    return latest, (instant, state)
        return latest, None

    @property
    def archived(self) -> ArchiveSummary:
        """How far the timeline was archived at the last listing: an instant at or before its `until` that the
        listing lacks completed (or never existed), and its files are as visible as a completed instant's."""
        if self._last_listing is None:
            self.instants()
        assert self._last_listing is not None
        return self._last_listing[2]

    def completed(self, actions: Iterable[Action] | None = None) -> list[Instant]:
        wanted = set(actions) if actions is not None else None
        return [i for i in self.instants() if i.is_completed and (wanted is None or i.action in wanted)]

    def pending(self, actions: Iterable[Action] | None = None) -> list[Instant]:
        wanted = set(actions) if actions is not None else None
        return [i for i in self.instants() if not i.is_completed and (wanted is None or i.action in wanted)]

    def history(self, actions: Iterable[Action] | None = None) -> Iterator[tuple[Instant, Content]]:
        """Every completed instant, archived ones first, each with its commit metadata (for replaying the whole
        table: fsck, the metadata rebuild, `metatable timeline --all`)."""
        wanted = set(actions) if actions is not None else None
        active = self.completed(actions)
        until = self.archived.until  # listed with `active`: the archive holds what the listing lacks
        for instant, content in self.archive.read(last=until):
            if wanted is None or instant.action in wanted:
                yield instant, content
        for instant in active:
            yield instant, self.read_json(instant)

    def archived_instants(self) -> list[Instant]:
        """The archived instants (all completed), oldest first: what `metatable timeline --all` lists before
        the active ones."""
        return [instant for instant, _ in self.archive.read(last=self.archived.until)]

    def get(self, time: str, action: Action | None = None) -> Instant | None:
        """The instant at `time` in its latest state, active or archived."""
        validate_time(time)
        found = [i for i in self.instants() if i.time == time and (action is None or i.action == action)]
        if found:
            return found[-1]
        if self.archived.holds(time):
            return next((i for i, _ in self.archive.read(time, time) if action is None or i.action == action), None)
        return None

    def last_time(self) -> str | None:
        times = [i.time for i in self.instants()]
        return max(times) if times else None

    def read_json(self, instant: Instant) -> dict[str, Any]:
        """The plan (requested; Avro for the actions in AVRO_PLANS), or the commit metadata (completed; from the
        archive when it was archived since it was listed)."""
        path = os.path.join(self.dir, instant.file_name)
        try:
            raw = _written.get(path) if instant.state is not State.REQUESTED else None
            if raw is None:
                raw = self.storage.read(path)
        except FileNotFoundError:
            if not instant.is_completed:
                raise
            archived = next((c for i, c in self.archive.read(instant.time, instant.time) if i == instant), None)
            if archived is None:
                raise
            return archived  # archived since the caller listed it
        if not raw:
            return {}
        try:
            if instant.state is State.REQUESTED and instant.action in AVRO_PLANS:
                return next(iter(fastavro.reader(io.BytesIO(raw))))
            return json.loads(raw)
        except (ValueError, StopIteration, EOFError) as e:
            raise TimelineError(f"unreadable instant file {path}: {e}. It holds the plan or commit metadata of "
                                f"{instant.action.value} {instant.time}; restore it from a backup under the same name "
                                "(`metatable fsck TABLE` checks the rest of the table)") from None

    def plan(self, instant: Instant) -> dict[str, Any]:
        return self.read_json(instant.to(State.REQUESTED))

    def plan_if_present(self, instant: Instant) -> dict[str, Any]:
        """A pending instant's plan; {} when it was rolled back (its files removed) since it was listed: a
        write that wins over a clustering, or a drop that cancels an indexing, does that at any moment."""
        try:
            return self.plan(instant)
        except FileNotFoundError:
            return {}

    # -- writing (callers hold the lock where the docstring says so) ------------------------------
    def new_time(self, *others: Timeline) -> str:
        """A time later than every instant here and on `others`; call under the lock."""
        last = max((t for t in [self.last_time(), self.archived.until, *(o.last_time() for o in others)] if t),
                   default=None)
        return next_time(last)

    def request(self, action: Action, time: str | None = None, plan: dict[str, Any] | None = None,
                others: Sequence[Timeline] = (), beat: bool = True) -> Instant:
        """Make a new instant in the requested state (under the lock). `beat` gives it a first heartbeat,
        for an instant its maker starts at once; a plan that waits for whoever runs it has none."""
        with self.lock.held():
            time = time or self.new_time(*others)
            instant = Instant(time, action, State.REQUESTED)
            if self.get(time, action) is not None:
                raise TimelineError(f"instant {time} {action.value} already exists on {self.dir}")
            if beat:
                self.heartbeat(instant).beat()
            self._write(instant, plan)
            return instant

    def transition(self, instant: Instant, state: State, content: dict[str, Any] | None = None) -> Instant:
        current = self.get(instant.time, instant.action)
        if current is None:
            raise TimelineError(f"instant {instant.time} {instant.action.value} does not exist on {self.dir}")
        if _STATE_RANK[state] != _STATE_RANK[current.state] + 1:
            raise TimelineError(f"cannot move instant {current} to {state.value}")
        target = instant.to(state)
        self._write(target, content)
        return target

    def start(self, instant: Instant) -> Instant:
        return self.transition(instant, State.INFLIGHT)

    def completion(self, instant: Instant, metadata: dict[str, Any] | None = None) -> Completion:
        """The completion of `instant` (inflight), prepared but not made: `complete` makes it in the same fence
        as its own (a data instant's completion makes its metadata deltacommit's, one request on an object
        store). What the instant wrote is made durable here, before anything can commit it."""
        current = self.get(instant.time, instant.action)
        if current is None or current.state is not State.INFLIGHT:
            raise TimelineError(f"cannot complete {current or instant} on {self.dir}: it is not inflight")
        target = instant.to(State.COMPLETED)
        self.storage.sync(self.dir)
        return Completion(self, target, Decision(os.path.join(self.dir, target.file_name),
                                                 self._encode(target, metadata or {})))

    def complete(self, instant: Instant, metadata: dict[str, Any] | None = None, beaten: bool = True,
                 with_heartbeat: Sequence[str] = (), along: Sequence[Completion] = ()) -> Instant:
        """Complete the instant, after the completions `along` (other timelines' instants that commit with it)
        in the same fence (`TableLock.fence`); its heartbeat goes (a roll-forward finished for a dead process
        leaves none), unless its maker knows it never had one (`beaten=False`: an attached metadata
        deltacommit), and with it, in one request on an object store, the files `with_heartbeat` names (a
        write's markers)."""
        completions = [*along, self.completion(instant, metadata)]
        made = self.lock.fence([c.decision for c in completions])
        for completion, created in zip(completions, made):
            if not created:
                raise TimelineError(f"timeline file {completion.decision.path} exists already: another process "
                                    f"completed {completion.instant.action.value} {completion.instant.time}; this "
                                    "one stops without changing it")
            completion.timeline.made(completion)
        done = completions[-1].instant
        if beaten or with_heartbeat:
            with after_the_commit_point(f"deleting the heartbeat of {instant.action.value} {instant.time}"):
                self.storage.delete_many([*([self._beat_path(instant)] if beaten else []), *with_heartbeat])
        return done

    def revert(self, instant: Instant) -> Instant:
        """An inflight instant back to requested (its plan stays), for a service whose process died."""
        current = self.get(instant.time, instant.action)
        if current is None or current.state is not State.INFLIGHT:
            raise TimelineError(f"cannot revert {current or instant} to requested: it is not inflight")
        self._delete(current.file_name)
        self._forget_beats(instant)
        return current.to(State.REQUESTED)

    def remove(self, instant: Instant) -> None:
        """Delete every state file of an instant, completed state first so it vanishes atomically for readers."""
        for state in (State.COMPLETED, State.INFLIGHT, State.REQUESTED):
            self._delete(instant.to(state).file_name)
        self._forget_beats(instant)

    def archive_run(self, run: list[Instant], carry: Carry) -> ArchiveSummary:
        """Move a completed run of instants (the oldest of the active timeline, oldest first) into the archive;
        under the lock. What the owner keeps of them for readers of the latest snapshot is `carry`'s."""
        with self.lock.held():
            self.finish_archival()
            contents: list[tuple[Instant, Content]] = [(i, self.read_json(i)) for i in run]
            summary = self.archive.append(contents, carry)
            for instant in run:
                self.remove(instant)
                crash_point("timeline.archive.remove")
            self.archive.merge_levels()
            return summary

    def finish_archival(self) -> None:
        """Delete the state files of archived instants that an archival which died left in the timeline."""
        until = self.archive.summary().until
        for name in self._names():
            if not is_temporary(name) and not name.startswith(".") and name[:17] <= until:
                self._delete(name)

    def _write(self, instant: Instant, content: dict[str, Any] | None) -> None:
        """A requested or inflight state file, created once (create-if-absent: a second transition to the same
        state fails instead of overwriting it). A completed one is the commit point: `complete` makes it, fenced
        by the lock (`lock.LeaseLock`)."""
        assert not instant.is_completed, "an instant completes through complete(), which the lock fences"
        path = os.path.join(self.dir, instant.file_name)
        data = self._encode(instant, content)
        if not self.storage.create_exclusive(path, data):
            raise TimelineError(f"timeline file {path} exists already: another process made the same transition of "
                                f"{instant.action.value} {instant.time}; this one stops without changing it")
        self._made(instant, path, data)

    def made(self, completion: Completion) -> None:
        """`completion`'s state file exists now (`complete` made it, maybe on another timeline's fence)."""
        self._made(completion.instant, completion.decision.path, completion.decision.data)

    def _made(self, instant: Instant, path: str, data: bytes) -> None:
        self._listed(add=instant.file_name)
        if instant.state is not State.REQUESTED and not self.storage.local:  # read back by its commit (a metadata
            _written.put(path, data)  # deltacommit's logs) and by the services after it (`maintenance`); a local
            # file is cheap to read, and a damaged one must read as damaged

    @staticmethod
    def _encode(instant: Instant, content: dict[str, Any] | None) -> bytes:
        if content is None:
            return b""
        if instant.state is State.REQUESTED and instant.action in AVRO_PLANS:
            out = io.BytesIO()
            fastavro.writer(out, schema(AVRO_PLANS[instant.action]), [content])
            return out.getvalue()
        return json.dumps(content, sort_keys=True).encode()

    def _delete(self, name: str) -> None:
        self.storage.delete(os.path.join(self.dir, name))
        _written.discard(os.path.join(self.dir, name))
        self._listed(remove=name)

    def _listed(self, add: str | None = None, remove: str | None = None) -> None:
        """Keep the listing cached for the lock's holders in step with their own changes."""
        held, epoch = _held_listings.get(self.dir), self.lock.epoch()
        if epoch is None:  # a change outside a holding (none is made so): whatever was listed is listed again
            _held_listings.pop(self.dir, None)
            _quiet_listings.pop(self.dir, None)
        if held is None or held[0] != epoch:
            return
        names = [n for n in held[1] if n != remove]
        if add is not None and add not in names:
            names = sorted([*names, add])
        _held_listings[self.dir] = (held[0], names)

    def _names(self) -> list[str]:
        """The timeline directory's listing. While this thread holds the lock, the listing taken in the lock's
        epoch (this holding, and the holdings of this process it continues) is reused and kept up to date by
        the holders' own changes: only lock holders change the timeline (a write lists it dozens of times, and
        on an object store each listing is a request). A read made at a quiet generation of the lock
        (`TableLock.quiet`) reuses the listing taken at it, or the one this process's holding left if its
        release made that generation."""
        epoch = self.lock.epoch()
        held = _held_listings.get(self.dir)
        if epoch is not None and held is not None and held[0] == epoch:
            return list(held[1])
        quiet = quiet_generation(self.lock.path) if epoch is None else None
        taken = _quiet_listings.get(self.dir)
        if quiet is not None and taken is not None and taken[0] == (self.lock.path, quiet):
            return list(taken[1])
        if quiet is not None and held is not None and released_as(self.lock.path) == (held[0], quiet):
            _quiet_listings[self.dir] = ((self.lock.path, quiet), held[1])  # as this process's holding left it
            return list(held[1])
        names = self.storage.list(self.dir)
        if epoch is not None:
            _held_listings[self.dir] = (epoch, names)
        elif quiet is not None:
            _quiet_listings[self.dir] = ((self.lock.path, quiet), names)
        return names

    # -- heartbeats -----------------------------------------------------------------------------
    def _beat_path(self, instant: Instant) -> str:
        return os.path.join(self.heartbeat_dir, instant.time)

    def _forget_beats(self, instant: Instant) -> None:
        self.storage.delete(self._beat_path(instant))

    def heartbeat(self, instant: Instant) -> Heartbeat:
        return Heartbeat(self.storage, self.heartbeat_dir, instant.time, self.heartbeat_interval_s)

    def is_expired(self, instant: Instant) -> bool:
        """Whether a pending instant's writer has stopped beating."""
        return is_expired(self.heartbeat_ages(), instant.time, self.heartbeat_interval_s, self.heartbeat_misses)

    def heartbeat_ages(self) -> dict[str, float]:
        """Instant time -> seconds since its process last beat. Read once per holding of the lock (recovery
        judges every pending instant under it; on an object store a reading is two requests)."""
        tenure = self.lock.tenure()
        if tenure is None or self._ages is None or self._ages[0] != tenure:
            self._ages = (tenure, self.storage.ages(self.heartbeat_dir))
        return self._ages[1]
