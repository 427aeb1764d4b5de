"""What a write read of the rows its keys had, handed to its commit: `StoredRows`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

FileGroup = tuple[str, str]  # (partition path, file id)
GROUP = "_mt_stored_group"  # a row's file group in `StoredRows.rows`: its number in `StoredRows.groups`
HELD = "_mt_stored_held"  # whether the group held the row's key


@dataclass(frozen=True)
class StoredRows:
    """The rows a write's keys had in the file slices it read to tell inserts from updates, as of the snapshot
    it began from (`write_engine.with_presence`): `rows` holds, for each row the write tagged, in its order, its
    file group (`GROUP`), record key, whether the group held the key (`HELD`) and some columns of the row it
    held (nulls where none). Its commit takes the stored versions of a secondary index from here instead of
    the index's reverse entries, when no write completed since in those groups (`data_commit.still_stored`):
    the read was paid anyway, and the 300,239 reverse entries of SF 1's 5% upsert took 1.06-1.66 s to read
    back (rocksdict's 3-5 us a key)."""

    groups: tuple[FileGroup, ...]
    rows: pa.Table

    @property
    def numbers(self) -> dict[FileGroup, int]:
        return {g: i for i, g in enumerate(self.groups)}

    def of_groups(self, numbers: np.ndarray) -> np.ndarray:
        """The rows of these file group numbers, a group after another, each in the write's order."""
        codes = self.rows[GROUP].to_numpy()
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(len(self.groups) + 1))
        return np.concatenate([order[bounds[n]:bounds[n + 1]] for n in numbers]) if len(numbers) else \
            np.zeros(0, np.int64)

    def partitions_and_file_ids(self, numbers: np.ndarray) -> tuple[pa.DictionaryArray, pa.DictionaryArray]:
        """The partition paths and file ids of these file group numbers."""
        codes = pa.array(np.asarray(numbers, np.int32))
        return (pa.DictionaryArray.from_arrays(codes, pa.array([p for p, _ in self.groups], pa.string())),
                pa.DictionaryArray.from_arrays(codes, pa.array([f for _, f in self.groups], pa.string())))
