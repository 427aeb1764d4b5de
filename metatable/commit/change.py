"""What one instant did to the data files: what the metadata indexes record of it (`index_records`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from metatable.commit.stored_rows import FileGroup, StoredRows
from metatable.file_group.written import WrittenFile
from metatable.timeline.instant import Action


@dataclass(frozen=True)
class Change:
    """What one instant did to the data files."""

    action: Action
    files: Sequence[WrittenFile]  # the files it added
    superseded: Mapping[FileGroup, str] = field(default_factory=dict)  # file group -> base no longer latest
    completed_at: int = 0  # when it completed (ns): record-index entries merge in completion order
    stored: StoredRows | None = None  # the rows its keys had where its write read them (a write's commit)
