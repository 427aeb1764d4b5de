"""The table lock, held only for short critical sections (making an instant, scheduling a service, a conflict
check and its commit), and the commit point it fences.

Two kinds, by where the table lives:
- `FileLock`: an OS file lock (`flock`) on `.metatable/lock`, for local and mounted file systems.
- `LeaseLock`: on an object store, which has no locks and no renames, a chain of create-only generations
  under `.metatable/lock/`: `<g>` (12 digits) is created with create-if-absent by whoever takes the lock,
  so exactly one process creates each generation. An empty generation means free; a held one names its owner
  (JSON). The holder rewrites `<g>.beat` while it holds the lock; one whose generation and beat are older than
  `lock.lease_s`, judged by the store's own clock (`Storage.ages`), may be taken over by creating `<g+1>`.

The fence: `fence(decisions)` is how a holder makes decisions (completed instants) that a holder whose
lease was taken over must not make late. Under a `LeaseLock` it first creates the next generation carrying
the decisions; if another process took the lock meanwhile, that generation exists and the holder fails
(`LeaseLostError`) instead of committing on a stale conflict check (Hudi's storage-based lock has no such
fence). Whoever takes the lock next finds decisions whose files are missing in the generation it takes over,
and writes those files, in order: a decided commit is rolled forward, never lost. One fence makes several
decisions that go together (a write's metadata deltacommit and its own completion). Under a `FileLock` the OS
guarantees the holder, and a fence is the create-if-absent writes alone.

Requests on an object store, uncontended: taking the lock is one create when this process released it less than
`TAKE_AFTER_RELEASE_S` ago (`_after_own_release`), else one LIST and one create; releasing it one create, a
fence one create; a beat every `lock.lease_s / 6` only while a section lasts that long; every `COLLECT_EVERY`
takings, the ages of the generations (`Storage.ages`: a PUT and a LIST) and one delete of the old ones.

Quiet reads: every change to what a reader sees (a completed instant, table.json, the metadata table's files)
is made by a lock holder, and every taking of a `LeaseLock` creates a generation. So while the newest
generation is a free one, nothing changes, and what a reader read since it was created may be read again
without asking the store. `quiet()` gives a read that generation (None under a `FileLock`, or while the lock
is held); the timeline listings and table.json are reused at it (`quiet_generation`), and a read at the
generation this process's release made reuses what its holding left (`released_as`).

Epochs: for the same reason, a holding that takes the free generation this process's last release made
(the listing its taking costs anyway shows it newest) follows that holding with nobody's between them: it
continues its `epoch`, and what the holders of the epoch listed stays valid (a write's commit lists nothing
its begin listed; consecutive writes of one process list nothing at all).
"""
from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import itertools
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence

from metatable.errors import LeaseLostError, LockTimeoutError, StorageAccessError, StorageError
from metatable.storage.base import Storage

log = logging.getLogger(__name__)

_local = threading.local()  # per thread: lock path -> depth of nested critical sections
_quiet = threading.local()  # per thread: lock path -> the free generation its reads are made at (`quiet`)
_free: dict[str, int] = {}  # lock path -> the newest generation this process found free
_released: dict[str, tuple[int, int]] = {}  # lock path -> (epoch, the free generation its release created)
_released_at: dict[str, float] = {}  # lock path -> when (`_boot_clock`) that release was
_tenures = itertools.count(1)
_leases: dict[str, _Lease] = {}  # lock path -> this process's holding of a LeaseLock
_mutexes: dict[str, threading.Lock] = {}  # lock path -> the threads of this process take turns here first
_registry = threading.Lock()
GENERATION_DIGITS = 12
KEEP_GENERATIONS = 16  # generations (and their beats) left behind when older ones are deleted
COLLECT_EVERY = 32  # delete old generations when a generation number is a multiple of this
COLLECT_AFTER_S = 600.0  # ... and only those this old (by the store's clock: `Storage.ages`): the lock directory
# holds ten minutes of generations (two LIST pages for a table written every second: two takings a write)
TAKE_AFTER_RELEASE_S = 60.0  # a taking this soon after this process's release creates the next generation unlisted


def _boot_clock() -> float:
    """Seconds on a clock that also counts the time the machine was suspended (a paused process sees the
    time pass: `_after_own_release`)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class Decision:
    """A file the holder creates once (create-if-absent) as a decision: a completed instant's state file."""

    path: str
    data: bytes


class TableLock(Protocol):
    path: str

    def held(self, shared: bool = False) -> Iterator[None]:
        """The lock, for the body; re-entrant within a thread."""

    def fence(self, decisions: Sequence[Decision]) -> list[bool]:
        """Create the decisions' files (create-if-absent), in order, as decisions of the holder; for each,
        False when it existed."""

    def tenure(self) -> int | None:
        """A number for this thread's current holding of the lock (None when it does not hold it)."""

    def epoch(self) -> int | None:
        """While this thread holds the lock: a number for the run of this process's holdings with nobody else's
        between them (a holding that takes the free generation the last one's release made continues it; else
        its tenure). What a holder read stays valid through the epoch, kept up to date by its own changes, since
        only holders change the timeline. None when this thread does not hold the lock."""

    def quiet(self, stale_ok: bool = False) -> contextlib.AbstractContextManager[int | None]:
        """For a read: the generation at which nothing has changed since (see the module docstring), or None.
        `stale_ok`: for a look whose every decision is made again under the lock (the services' looks after a
        commit), the generation this process's own release made, not asked of the store."""

    def unchanged(self, generation: int) -> bool:
        """Whether no process took the lock since `generation` (found free by `quiet`) was the newest."""


def quiet_generation(path: str) -> int | None:
    """The free generation this thread's read of the table whose lock path is `path` is made at, if any."""
    return getattr(_quiet, "generations", {}).get(path)


def released_as(path: str) -> tuple[int, int] | None:
    """(epoch, generation): the epoch of this process's last holding of the lock at `path` and the free
    generation its release created. What the holder saw at its end is what a read at that generation sees: a
    read just after a commit (the services it may call for) lists nothing its commit listed."""
    return _released.get(path)


@contextmanager
def _quiet_at(path: str, generation: int | None) -> Iterator[int | None]:
    generations = _quiet.__dict__.setdefault("generations", {})
    outer = generations.get(path)
    if generation is None:
        generations.pop(path, None)
    else:
        generations[path] = generation
    try:
        yield generation
    finally:
        if generations.get(path) is None or outer is None:  # ended by a holding of the lock (`held`), or outermost
            generations.pop(path, None)
        else:
            generations[path] = outer


def table_lock(storage: Storage, path: str, timeout_s: float = 60.0, lease_s: float = 60.0) -> TableLock:
    """The lock of the table whose lock path is `path`, of the kind its storage allows."""
    if storage.local:
        return FileLock(storage, path, timeout_s)
    return LeaseLock(storage, path, timeout_s, lease_s)


def _depths() -> dict[str, int]:
    depth = getattr(_local, "depth", None)
    if depth is None:
        depth = _local.depth = {}
    return depth


def _tenure_of(path: str) -> dict[str, int]:
    tenure = getattr(_local, "tenure", None)
    if tenure is None:
        tenure = _local.tenure = {}
    return tenure


def _epoch_of(path: str) -> dict[str, int]:
    epoch = getattr(_local, "epoch", None)
    if epoch is None:
        epoch = _local.epoch = {}
    return epoch


class FileLock:
    """Exclusive (or shared, for checks), process-wide, re-entrant within a thread (nested critical sections
    are fine)."""

    def __init__(self, storage: Storage, path: str, timeout_s: float = 60.0) -> None:
        self.storage = storage
        self.path = path
        self.timeout_s = timeout_s

    def tenure(self) -> int | None:
        return _tenure_of(self.path).get(self.path) if _depths().get(self.path) else None

    def epoch(self) -> int | None:
        return _epoch_of(self.path).get(self.path) if _depths().get(self.path) else None

    def fence(self, decisions: Sequence[Decision]) -> list[bool]:
        return [self.storage.create_exclusive(d.path, d.data) for d in decisions]

    def quiet(self, stale_ok: bool = False) -> contextlib.AbstractContextManager[int | None]:
        return contextlib.nullcontext(None)  # a listing of a local directory costs no request

    def unchanged(self, generation: int) -> bool:
        return False

    @contextmanager
    def held(self, shared: bool = False) -> Iterator[None]:
        """The lock, for the body. `shared`: only so that no commit happens meanwhile (a check that reads
        two things that must agree); it needs no write access, so it works on read-only storage, where
        nobody commits."""
        depth = _depths()
        if depth.get(self.path):
            depth[self.path] += 1
            try:
                yield
            finally:
                depth[self.path] -= 1
            return
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, (os.O_RDONLY if shared else os.O_RDWR) | os.O_CREAT, 0o644)
        except OSError as e:
            if not (shared and e.errno in (errno.EROFS, errno.EACCES)):
                raise
            yield  # storage nobody may write to: nothing commits meanwhile
            return
        try:
            deadline = time.monotonic() + self.timeout_s
            while True:
                try:
                    fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise LockTimeoutError(
                            f"could not take the table lock {self.path} within {self.timeout_s}s; "
                            "another process holds it (a stuck writer?)"
                        ) from None
                    time.sleep(0.005)
            depth[self.path] = 1
            _tenure_of(self.path)[self.path] = _epoch_of(self.path)[self.path] = next(_tenures)  # no generations to
            # tell whether another process held it since this one did
            try:
                yield
            finally:
                depth[self.path] = 0
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


@dataclass
class _Lease:
    """One holding of a `LeaseLock`: its generation (a fence moves it on), and the signal that stops renewing."""

    generation: int
    stop: threading.Event = field(default_factory=threading.Event)


class LeaseLock:
    """A lock held as a lease on an object store (see the module docstring)."""

    def __init__(self, storage: Storage, path: str, timeout_s: float = 60.0, lease_s: float = 60.0) -> None:
        self.storage = storage
        self.path = path
        self.timeout_s = timeout_s
        self.lease_s = lease_s
        with _registry:
            self._mutex = _mutexes.setdefault(path, threading.Lock())

    @property
    def owner(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}"

    def generation_path(self, generation: int) -> str:
        return os.path.join(self.path, f"{generation:0{GENERATION_DIGITS}d}")

    def tenure(self) -> int | None:
        return _tenure_of(self.path).get(self.path) if _depths().get(self.path) else None

    def epoch(self) -> int | None:
        return _epoch_of(self.path).get(self.path) if _depths().get(self.path) else None

    def quiet(self, stale_ok: bool = False) -> contextlib.AbstractContextManager[int | None]:
        """Known from an earlier read: two HEADs (the generation exists, the next does not; old generations
        are deleted only once 16 newer ones exist, so an existing one has not been skipped over); else, or
        when it moved on, one LIST of the generations. Nested reads keep the outer one's; a holder's reads
        have the holder's listings (`tenure`).

        `stale_ok` and this process's release made the newest generation it knows of: that one, without a
        request. The two HEADs would show the lock unchanged at their moment, and another process may take it
        the moment after them anyway: a look without the lock is a look at a moment that may have passed,
        whatever it asked. What it reads is reused later only at this generation, by a read that found it
        still the newest (then nothing changed since it was made), or by another such look. 2 of a small
        write's requests on an object store."""
        if self.tenure() is not None:
            return contextlib.nullcontext(None)
        generation = quiet_generation(self.path)
        released = _released.get(self.path)
        if generation is None and stale_ok and released is not None and _free.get(self.path) == released[1]:
            generation = released[1]
        return _quiet_at(self.path, generation if generation is not None else self._quiet_generation())

    def _quiet_generation(self) -> int | None:
        known = _free.get(self.path)
        if known is not None and self.storage.exists(self.generation_path(known)) and self.unchanged(known):
            return known
        files = {os.path.basename(f.path): f for f in self.storage.walk(self.path)}
        generations = sorted(int(n) for n in files if n.isdigit())
        if not generations or files[f"{generations[-1]:0{GENERATION_DIGITS}d}"].size:  # none yet, or held
            _free.pop(self.path, None)
            return None
        _free[self.path] = generations[-1]
        return generations[-1]

    def unchanged(self, generation: int) -> bool:
        return not self.storage.exists(self.generation_path(generation + 1))

    @contextmanager
    def held(self, shared: bool = False) -> Iterator[None]:
        depth = _depths()
        if depth.get(self.path):
            depth[self.path] += 1
            try:
                yield
            finally:
                depth[self.path] -= 1
            return
        if not self._mutex.acquire(timeout=self.timeout_s):
            raise LockTimeoutError(f"could not take the table lock {self.path} within {self.timeout_s}s; another "
                                   "thread of this process holds it")
        try:
            lease = self._acquire()
        except StorageAccessError:
            self._mutex.release()
            if not shared:
                raise
            yield  # a store this process may not write to: it commits nothing meanwhile
            return
        except BaseException:
            self._mutex.release()
            raise
        depth[self.path] = 1
        _tenure_of(self.path)[self.path] = tenure = next(_tenures)
        released = _released.pop(self.path, None)  # set again by this holding's release, if it makes one
        epoch = _epoch_of(self.path)[self.path] = \
            released[0] if released is not None and released[1] == lease.generation - 1 else tenure
        # a holding moves the lock on: a read around it is not quiet any more, nor one it is nested in (`quiet`)
        getattr(_quiet, "generations", {}).pop(self.path, None)
        renewal = threading.Thread(target=self._renew, args=(lease,), name=f"lease-{lease.generation}",
                                   daemon=True)
        renewal.start()
        try:
            yield
        finally:
            depth[self.path] = 0
            lease.stop.set()
            renewal.join()
            try:
                if self._release(lease):
                    _free[self.path] = lease.generation + 1
                    _released[self.path] = (epoch, lease.generation + 1)
                    _released_at[self.path] = _boot_clock()
            finally:
                self._mutex.release()

    def fence(self, decisions: Sequence[Decision]) -> list[bool]:
        lease = _leases.get(self.path)
        assert lease is not None and _depths().get(self.path), "a fence needs the lock held"
        record = self._record(commits=[{"path": d.path, "data": base64.b64encode(d.data).decode()}
                                       for d in decisions])
        if not self.storage.create_exclusive(self.generation_path(lease.generation + 1), record):
            raise LeaseLostError(
                f"the table lock {self.path} was taken over by another process while this one held it (its lease "
                f"of {self.lease_s}s ran out: the process was paused or cut off from the store), so "
                f"{', '.join(d.path for d in decisions)} was not written; nothing of the operation is visible, "
                "retry it")
        lease.generation += 1
        return [self.storage.create_exclusive(d.path, d.data) for d in decisions]

    # -- taking, renewing and giving back ---------------------------------------------------------------
    def _record(self, **extra: object) -> bytes:
        return json.dumps({"owner": self.owner, "nonce": uuid.uuid4().hex, **extra}, sort_keys=True).encode()

    def _acquire(self) -> _Lease:
        # the lease and the commits it fences rely on create-if-absent; a reader takes no lock and needs none
        self.storage.check(os.path.dirname(self.path))
        after_release = self._after_own_release()
        if after_release is not None and self.storage.create_exclusive(self.generation_path(after_release),
                                                                         self._record()):
            return self._took(after_release)
        deadline = time.monotonic() + self.timeout_s
        delay = 0.005
        while True:
            files = {os.path.basename(f.path): f for f in self.storage.walk(self.path)}
            generations = sorted(int(n) for n in files if n.isdigit())
            last = generations[-1] if generations else 0
            taken_from: dict | None = None
            if last and files[f"{last:0{GENERATION_DIGITS}d}"].size:  # held (a free generation is empty)
                try:
                    taken_from = json.loads(self.storage.read(self.generation_path(last)))
                except FileNotFoundError:  # collected meanwhile: a newer one exists
                    continue
                ours = taken_from.get("owner") == self.owner  # a holding of this process whose release failed
                age = math.inf if ours else self._age(last)  # (one thread of a process is here at a time)
                if age < self.lease_s:
                    if time.monotonic() > deadline:
                        raise LockTimeoutError(
                            f"could not take the table lock {self.path} within {self.timeout_s}s; "
                            f"{taken_from.get('owner')} holds it (its lease was renewed {age:.1f}s ago)")
                    time.sleep(delay)
                    delay = min(delay * 2, 0.25)
                    continue
                if not ours:
                    log.warning("taking over the table lock %s from %s: its lease was last renewed %.1fs ago",
                                self.path, taken_from.get("owner"), age)
            if not self.storage.create_exclusive(self.generation_path(last + 1), self._record()):
                continue  # another process took it first
            if taken_from:
                self._roll_forward(taken_from.get("commits", ()))
            return self._took(last + 1)

    def _after_own_release(self) -> int | None:
        """The generation after the free one this process's release made, if that was less than
        `TAKE_AFTER_RELEASE_S` ago: creating it takes the lock without listing the generations first. If it
        can be created, nobody took the lock since that release. It cannot have been created and collected
        since, which would let a second holder create it again: a generation is collected only once it is
        `COLLECT_AFTER_S` old, by the store's clock, and this one would be younger than the time since the
        release, by this machine's. Two durations, each by one clock: no two hosts' clocks compared."""
        released, at = _released.get(self.path), _released_at.get(self.path)
        if released is None or at is None or _boot_clock() - at > TAKE_AFTER_RELEASE_S:
            return None
        return released[1] + 1

    def _took(self, generation: int) -> _Lease:
        lease = _leases[self.path] = _Lease(generation)
        if generation % COLLECT_EVERY == 0:
            old = [n for n, age in self.storage.ages(self.path).items() if n.split(".")[0].isdigit() and
                   int(n.split(".")[0]) < generation - 1 - KEEP_GENERATIONS and age > COLLECT_AFTER_S]
            self.storage.delete_many([os.path.join(self.path, n) for n in old])
        return lease

    def _age(self, generation: int) -> float:
        """Seconds since the holder of `generation` showed it was alive (created it, or renewed it)."""
        ages = self.storage.ages(self.path)
        name = f"{generation:0{GENERATION_DIGITS}d}"
        return min(ages.get(name, float("inf")), ages.get(f"{name}.beat", float("inf")))

    def _roll_forward(self, commits: Sequence[dict]) -> None:
        """Decisions the previous holder fenced and then did not finish writing (it died, or was cut off)."""
        for commit in commits:
            if self.storage.create_exclusive(commit["path"], base64.b64decode(commit["data"])):
                log.warning("rolled forward %s: its holder fenced it and stopped before writing it", commit["path"])

    def _renew(self, lease: _Lease) -> None:
        while not lease.stop.wait(self.lease_s / 6):
            try:
                self.storage.write_atomic(f"{self.generation_path(lease.generation)}.beat", b"")
            except (OSError, StorageError) as e:  # the next fence tells whether the lease was lost
                log.warning("could not renew the table lock %s: %s", self.path, e)

    def _release(self, lease: _Lease) -> bool:
        """Whether this release created the next (free) generation."""
        _leases.pop(self.path, None)
        try:
            released = self.storage.create_exclusive(self.generation_path(lease.generation + 1), b"")
        except (OSError, StorageError) as e:
            log.warning("could not release the table lock %s (%s): it is free again once its lease of %ss runs out",
                        self.path, e, self.lease_s)
            return False
        if not released:
            log.warning("the table lock %s was taken over while this process held it (its lease of %ss ran out); "
                        "nothing was committed after that", self.path, self.lease_s)
        return released
