"""Base file names: `<file_id>_<write_token>_<instant>.<extension>` (Parquet data, SST metadata)."""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from metatable.errors import InvalidInputError
from metatable.timeline.instant import validate_time

PARQUET = "parquet"  # data tables' base files (metadata tables' are SST)
_TOKEN_RE = re.compile(r"^[0-9A-Za-z-]+$")


def new_write_token() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class BaseFile:
    file_id: str
    write_token: str
    instant: str
    extension: str

    def __post_init__(self) -> None:
        validate_time(self.instant)
        if not _TOKEN_RE.match(self.write_token):
            raise InvalidInputError(f"bad write token {self.write_token!r}: letters, digits and '-' only")
        if not self.file_id or "/" in self.file_id or self.file_id.startswith("."):
            raise InvalidInputError(f"bad file id {self.file_id!r}")

    @property
    def file_name(self) -> str:
        return f"{self.file_id}_{self.write_token}_{self.instant}.{self.extension}"

    @classmethod
    def parse(cls, file_name: str) -> BaseFile:
        stem, dot, extension = file_name.rpartition(".")
        parts = stem.rsplit("_", 2)
        if not dot or len(parts) != 3 or file_name.startswith("."):
            raise InvalidInputError(f"bad base file name {file_name!r}: expected <file_id>_<token>_<instant>.<ext>")
        return cls(parts[0], parts[1], parts[2], extension)
