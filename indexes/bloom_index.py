"""The bloom index's write placement: existing keys go where the lookup finds them, new keys to insert slots.

The driver pins, per partition, the file groups new keys may go to (`insert_slots`: small existing ones
first, then enough new ones for the batch); a new key picks among them by `hash32(key)`, so every executor
decides alike without coordination. Where keys live is found by the three-level lookup (`lookup`), which
the engine runs over the pinned file slices and hands in as `locate`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from metatable.errors import InvalidInputError

from .arrow_keys import hash32_array
from .assigner import Assignment

# (keys, partition of each key or None for all partitions) -> (partition, file id) of each, None if absent
Locate = Callable[[list[str], list[str] | None], tuple[Sequence[str | None], Sequence[str | None]]]


@dataclass(frozen=True)
class BloomPlan:
    """What the driver pins for a bloom-index write."""

    ranges: Mapping[str, Mapping[str, tuple[Any, Any]]] = field(default_factory=dict)  # partition -> base -> key range
    insert_slots: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # partition -> file ids for new keys
    global_scope: bool = False
    moves: bool = False  # an upsert of a global index: a key arriving with another partition value moves there


def insert_slots(partition_rows: Mapping[str, int], sizes: Mapping[str, Mapping[str, int]], bytes_per_row: float,
                 target: int, instant: str) -> dict[str, tuple[str, ...]]:
    """Per partition, the file groups new keys may go to: those below `target` bytes (smallest first), then
    enough new ones (`<instant>-<n>`) for the batch's rows at `bytes_per_row`, had they all been new."""
    out = {}
    for partition, rows in partition_rows.items():
        small = sorted((size, fid) for fid, size in sizes.get(partition, {}).items() if size < target)
        room = sum(target - size for size, _ in small)
        needed = rows * bytes_per_row - room
        fresh = int(np.ceil(needed / target)) if needed > 0 else 0
        slots = [fid for _, fid in small] + [f"{instant}-{n:04d}" for n in range(fresh)]
        out[partition] = tuple(slots or [f"{instant}-0000"])
    return out


class BloomAssigner:
    def __init__(self, plan: BloomPlan, locate: Locate) -> None:
        self.plan = plan
        self.locate = locate

    def assign(self, keys: pa.Array, partitions: pa.Array) -> Assignment:
        """A key found in some file group stays there (in global scope, a delete or insert naming another
        partition too; an upsert there moves it when the plan says so: to an insert slot of the row's
        partition, deleted from its file group); a new key goes to an insert slot of its partition, or
        nowhere when the plan has no slots (a delete of an absent key)."""
        incoming = partitions.to_pylist()
        found_partition, found_file = self.locate(keys.to_pylist(), None if self.plan.global_scope else incoming)
        out_partitions = np.array(found_partition, dtype=object)
        files = np.array(found_file, dtype=object)
        moved_from = None
        if self.plan.moves:
            moving = ~np.equal(files, None) & (out_partitions != np.array(incoming, dtype=object))
            if moving.any():
                moved_from = (pa.array(np.where(moving, out_partitions, None).tolist(), pa.string()),
                              pa.array(np.where(moving, files, None).tolist(), pa.string()))
                files[moving] = None  # placed below as a new key of the row's partition
        new = np.equal(files, None)
        present = pa.array(~new)
        if new.any():
            arriving = np.array(incoming, dtype=object)
            out_partitions[new] = arriving[new]
            if self.plan.insert_slots:
                hashes = hash32_array(keys)
                for partition in set(arriving[new]):
                    slots = self.plan.insert_slots.get(partition)
                    if not slots:
                        raise InvalidInputError(f"no insert file group planned for partition {partition!r}")
                    mine = new & (arriving == partition)
                    files[mine] = np.array(slots, dtype=object)[hashes[mine] % len(slots)]
        return Assignment(pa.array(out_partitions.tolist(), pa.string()), pa.array(files.tolist(), pa.string()),
                          moved_from, present)
