"""Avro log files: one file per deltacommit per file group.

Name: `.<file_id>_<base_instant>.log.<version>_<write_token>`. The Avro header
carries the block's instant, its kind (records, or a rollback command naming
the instant it undoes) and its record count; a file whose blocks do not add up
to that count is truncated. Files are published atomically, so a torn file can
only be a leftover of a crash; readers skip files of instants that never
completed and raise CorruptFileError for a completed instant's unreadable file.
"""
from __future__ import annotations

import enum
import io
import re
from dataclasses import dataclass
from typing import Any, Iterable

import fastavro

from .errors import CorruptFileError, InvalidInputError
from .instant import validate_time
from .schemas import schema
from .storage import Storage

_NAME_RE = re.compile(r"^\.(?P<file_id>.+)_(?P<base>\d{17})\.log\.(?P<version>\d+)_(?P<token>[0-9A-Za-z-]+)$")


class BlockKind(str, enum.Enum):
    RECORDS = "records"
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class LogFile:
    """The name of a log file: which file group and file slice it belongs to, and its order in the slice."""

    file_id: str
    base_instant: str
    version: int
    write_token: str

    def __post_init__(self) -> None:
        validate_time(self.base_instant)
        if self.version < 1:
            raise InvalidInputError(f"log version must be >= 1, got {self.version}")

    @property
    def file_name(self) -> str:
        return f".{self.file_id}_{self.base_instant}.log.{self.version}_{self.write_token}"

    @classmethod
    def parse(cls, file_name: str) -> LogFile:
        m = _NAME_RE.match(file_name)
        if not m:
            raise InvalidInputError(
                f"bad log file name {file_name!r}: expected .<file_id>_<base_instant>.log.<version>_<token>"
            )
        return cls(m["file_id"], m["base"], int(m["version"]), m["token"])

    @property
    def instant(self) -> str:
        """Write tokens are `<instant>-<nonce>`: the instant is known without opening the file."""
        return self.write_token.split("-", 1)[0]

    @staticmethod
    def is_log_name(file_name: str) -> bool:
        return _NAME_RE.match(file_name) is not None


@dataclass(frozen=True)
class LogBlock:
    instant: str
    kind: BlockKind
    entries: list[tuple[str, bytes]]  # (key, encoded record), sorted by key
    target_instant: str | None = None  # the instant a rollback block undoes


def write_container(storage: Storage, path: str, schema: Any, records: Iterable[dict[str, Any]], count: int,
                    meta: dict[str, str]) -> None:
    """An Avro container file whose header says how many records it holds; published atomically."""
    buf = io.BytesIO()
    fastavro.writer(buf, schema, records, metadata={**meta, "metatable.count": str(count)}, codec="null",
                    sync_interval=1 << 20)
    storage.write_atomic(path, buf.getvalue())


def read_container(storage: Storage, path: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Header metadata and every record; a short or unreadable file is a CorruptFileError naming it."""
    data = _read(storage, path)
    try:
        reader = fastavro.reader(io.BytesIO(data))
        meta = dict(reader.metadata)
        records = list(reader)
        expected = int(meta["metatable.count"])
    except Exception as e:  # fastavro raises assorted types on garbage
        raise CorruptFileError(path, f"unreadable log block ({type(e).__name__}: {e})") from None
    if len(records) != expected:
        raise CorruptFileError(path, f"truncated log block: {len(records)} of {expected} records")
    return meta, records


def write_log(storage: Storage, path: str, block: LogBlock) -> None:
    meta = {"metatable.instant": block.instant, "metatable.block_kind": block.kind.value}
    if block.target_instant:
        meta["metatable.target_instant"] = block.target_instant
    write_container(storage, path, schema("log_entry"), ({"key": k, "value": v} for k, v in block.entries),
                    len(block.entries), meta)


def read_log(storage: Storage, path: str) -> LogBlock:
    meta, records = read_container(storage, path)
    try:
        return LogBlock(meta["metatable.instant"], BlockKind(meta["metatable.block_kind"]),
                        [(r["key"], r["value"]) for r in records], meta.get("metatable.target_instant"))
    except (KeyError, ValueError) as e:
        raise CorruptFileError(path, f"log header lacks {e}") from None


def _read(storage: Storage, path: str) -> bytes:
    try:
        return storage.read(path)
    except FileNotFoundError:
        raise CorruptFileError(path, "log file vanished (cleaned while being read?)") from None
