"""One root error class and a small hierarchy; every message names the problem and what to do."""
from __future__ import annotations

import errno
import logging
import os
import re
from contextlib import contextmanager
from typing import Any, Iterator

import pyarrow as pa


class MetatableError(Exception):
    """Root of every error metatable raises on purpose."""


class InvalidInputError(MetatableError, ValueError):
    """Caller-supplied data or arguments are wrong (null key, schema mismatch, bad name...)."""


class ConfigError(InvalidInputError):
    """An unknown or invalid option."""


class TableNotFoundError(MetatableError, FileNotFoundError):
    """No metatable table (or metadata table) at the given path."""


class TableExistsError(MetatableError, FileExistsError):
    """Creating a table where one already exists."""


class UnknownPartitionError(InvalidInputError, KeyError):
    """A metadata partition that this table does not have."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


_WRITER_RE = re.compile(r"(\d{17})(?!.*\d{17})")  # a file name's last instant time is its writer's:
# base files end `_<instant>.<ext>`, log files `_<instant>-<write token>`
RESTORE_ADVICE = ("Restore it from a backup under the same name; `metatable fsck TABLE` lists every damaged or "
                  "missing file")
REBUILD_ADVICE = ("The metadata table can be rebuilt from the data files and the timeline: `metatable metadata "
                  "rebuild TABLE` (`Table.rebuild_metadata()`)")


class CorruptFileError(MetatableError):
    """A file that exists but cannot be read as what it claims to be. The message names the file, the instant
    that wrote it, what still works and what to do: a data file is restored from a backup (reads as of an
    earlier instant never read it); a metadata-table file is rebuilt from the data files."""

    problem = "corrupt file"

    def __init__(self, path: str, reason: str, *, metadata: bool = False) -> None:
        self.path = path
        self.reason = reason
        self.metadata = metadata
        found = _WRITER_RE.search(os.path.basename(path))
        self.instant = found.group(1) if found else None
        text = f"{self.problem} {path}: {reason}"
        if self.instant:
            text += f" (written by instant {self.instant}"
            if not metadata:
                text += "; reads as of an earlier instant do not read it: `metatable read TABLE --as-of INSTANT`"
            text += ")"
        super().__init__(f"{text}. {REBUILD_ADVICE if metadata else RESTORE_ADVICE}")

    def __reduce__(self) -> tuple[Any, ...]:  # Spark pickles errors raised in tasks
        return (type(self), (self.path, self.reason), {"metadata": self.metadata})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(self.path, self.reason, **state)  # type: ignore[misc]


class MissingFileError(CorruptFileError):
    """A file that a commit references and that is gone."""

    problem = "missing file"


@contextmanager
def naming_damage(path: str, *, metadata: bool = False) -> Iterator[None]:
    """Reading `path`: what the format libraries raise on a damaged or missing file (`OSError: ZSTD
    decompression failed`, `FileNotFoundError`, ArrowInvalid...) becomes an error that names it."""
    try:
        yield
    except CorruptFileError:
        raise
    except FileNotFoundError:
        raise MissingFileError(path, "it is referenced by a commit and gone", metadata=metadata) from None
    except (OSError, pa.ArrowException) as e:
        raise CorruptFileError(path, f"{type(e).__name__}: {e}", metadata=metadata) from None


class ConflictError(MetatableError):
    """Optimistic concurrency: another writer committed to the same file groups first."""


class ClusteringConflict(ConflictError):
    """A write met a clustering of its file groups (`clustering.updates = "reject"`): nothing of the write is
    visible; retry it once the named clustering instant has completed."""

    def __init__(self, message: str, clustering: str) -> None:
        super().__init__(message)
        self.clustering = clustering


class MetadataReplacedError(ConflictError):
    """Another process rebuilt the metadata table after this one opened the table: a commit from the old one
    would be lost to readers, so it stops with nothing visible; open the table again (a write does, and runs
    again)."""


class LockTimeoutError(MetatableError, TimeoutError):
    """The table lock could not be taken in time."""


class LeaseLostError(ConflictError):
    """On an object store, the table lock is a lease: a holder paused or cut off for longer than `lock.lease_s`
    loses it to another process, and its commit fails (nothing of it visible) instead of landing on a stale
    conflict check. A write runs again like one that met a conflict."""


class TimelineError(MetatableError):
    """An instant transition that the timeline does not allow."""


class RollbackError(MetatableError):
    """An instant that cannot be rolled back (already compacted, unknown...)."""


class SnapshotExpiredError(InvalidInputError):
    """A read as of a time whose files clean has removed (or before the table's first commit): the message says
    which times are still readable."""


class StorageError(MetatableError):
    """The storage refused a write: a read-only file system, no permission, or no space left. Nothing of the
    operation that met it is visible; reads of the table still work."""


class StorageAccessError(StorageError):
    """An object store refused a request for want of permission (credentials, the bucket's policy)."""


STORAGE_ADVICE = {
    errno.EROFS: "the file system is mounted read-only: reads work; writes and table services need it writable",
    errno.EACCES: "this process may not write there: reads work; writes and table services need write access",
    errno.EPERM: "this process may not write there: reads work; writes and table services need write access",
    errno.ENOSPC: "the disk is full: free space and retry (`metatable rollback TABLE` then removes what the "
                  "failed operation left)",
    errno.EDQUOT: "the disk quota is used up: free space and retry (`metatable rollback TABLE` then removes what "
                  "the failed operation left)",
}


@contextmanager
def storage_errors(what: str) -> Iterator[None]:
    """Around an operation on a table: the OS refusing a write becomes a StorageError that says what to do."""
    try:
        yield
    except OSError as e:
        if isinstance(e, MetatableError) or e.errno not in STORAGE_ADVICE:
            raise
        raise StorageError(f"{what} failed: cannot write {e.filename or 'to the table'}: {e.strerror}; "
                           f"{STORAGE_ADVICE[e.errno]}. Nothing of it is visible") from e


class IndexingAborted(MetatableError):
    """The async indexer gave up (a write it had to wait for was still running at `indexer.catchup_timeout_s`,
    or a file it had to read was cleaned); the partitions it was building are removed: schedule it again."""


@contextmanager
def after_the_commit_point(what: str) -> Iterator[None]:
    """Tidying up after an instant completed (its heartbeat, its markers, files it adopted): the commit is
    durable, so a storage failure here must not make it look failed. It is logged with what was left behind
    (a heartbeat or markers go with the next sweep of leftovers, `commit.leftovers`)."""
    try:
        yield
    except (OSError, StorageError) as e:
        logging.getLogger("metatable").warning("%s after its commit failed; the commit stands: %s", what, e)
