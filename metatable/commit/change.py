"""What one instant did to the data files: what the metadata indexes record of it (`index_records`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from metatable.commit.stored_rows import FileGroup, StoredRows
from metatable.file_group.base_file import PARQUET, BaseFile
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

    @property
    def final_files(self) -> list[WrittenFile]:
        """Its files but the bases that a newer base of their file group in the same change follows (a
        copy-on-write resize writes one per write it caught up): what says which rows each group holds after
        the change, for the indexes of keys and values."""
        def base_instant(f: WrittenFile) -> str | None:
            return BaseFile.parse(f.file_name).instant if f.file_name.endswith("." + PARQUET) else None

        newest: dict[FileGroup, str] = {}
        for f in self.files:
            instant = base_instant(f)
            if instant is not None:
                newest[(f.partition, f.file_id)] = max(instant, newest.get((f.partition, f.file_id), instant))
        return [f for f in self.files if base_instant(f) in (None, newest.get((f.partition, f.file_id)))]
