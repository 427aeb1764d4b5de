"""One root error class and a small hierarchy; every message names the problem and what to do."""
from __future__ import annotations


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


class CorruptFileError(MetatableError):
    """A file that exists but cannot be read as what it claims to be."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"corrupt file {path}: {reason}")
        self.path = path


class ConflictError(MetatableError):
    """Optimistic concurrency: another writer committed to the same file groups first."""


class ClusteringConflict(ConflictError):
    """A write met a clustering of its file groups (`clustering.updates = "reject"`): nothing of the write is
    visible; retry it once the named clustering instant has completed."""

    def __init__(self, message: str, clustering: str) -> None:
        super().__init__(message)
        self.clustering = clustering


class LockTimeoutError(MetatableError, TimeoutError):
    """The table lock could not be taken in time."""


class TimelineError(MetatableError):
    """An instant transition that the timeline does not allow."""


class RollbackError(MetatableError):
    """An instant that cannot be rolled back (already compacted, unknown...)."""


class IndexingAborted(MetatableError):
    """The async indexer gave up (a write it had to wait for was still running at `indexer.catchup_timeout_s`,
    or a file it had to read was cleaned); the partitions it was building are removed: schedule it again."""
