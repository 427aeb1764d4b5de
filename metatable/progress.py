"""Progress bars of long in-process jobs (loads, compaction, clustering, indexing): shown on a terminal only
(tqdm's `disable=None`), so logs, pipes and tests stay clean."""
from __future__ import annotations

from typing import Iterable, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def progress(items: Iterable[T], what: str, unit: str = "file group", total: int | None = None) -> Iterable[T]:
    return tqdm(items, desc=what, unit=unit, total=total, disable=None, leave=False)
