"""Plain-Python models of what the metadata table should return, and record strategies."""
from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

FILE_NAMES = ["a.parquet", "b.parquet", "c.parquet"]


def size_of(name: str) -> int:
    return 100 + FILE_NAMES.index(name) if name in FILE_NAMES else 1


files_record = st.builds(
    lambda entries, deleted: {"files": dict(entries), "is_deleted": deleted},
    st.lists(st.sampled_from(FILE_NAMES).flatmap(
        lambda n: st.booleans().map(lambda dead: (n, {"size": size_of(n), "is_deleted": dead}))), max_size=3),
    st.booleans())
bloom_record = st.builds(
    lambda payload: {"file_name": "f", "filter_type": "t", "instant": "1", "bloom_filter": payload,
                     "is_deleted": False}, st.binary(max_size=8))
stats_record = st.builds(
    lambda lo, width, n: {"file_name": "f", "column_name": "c", "min_value": lo, "max_value": lo + width,
                          "null_count": 0, "value_count": n, "total_size": 10 * n, "is_deleted": False,
                          "resets": False},
    st.integers(-50, 50), st.integers(0, 10), st.integers(1, 5))
# `completed_at` is stamped when the record is written (`stamped`): completions only move forward
record_index_record = st.builds(
    lambda file_id, deleted: {"partition_path": "p", "file_id": file_id, "instant": "1", "completed_at": 0,
                              "is_deleted": deleted}, st.sampled_from(["f1", "f2"]), st.booleans())
RECORDS = {"files": files_record, "bloom_filter": bloom_record, "column_stats": stats_record,
           "record_index": record_index_record}
RECORD_INDEX_TOMBSTONE = {"partition_path": "", "file_id": "", "instant": "", "completed_at": 0, "is_deleted": True}


def stamped(batch: dict[str, dict[str, Any]], completed_at: int) -> dict[str, dict[str, Any]]:
    """`batch` with its record_index entries completed at `completed_at`."""
    entries = batch.get("record_index")
    if not entries:
        return batch
    return {**batch, "record_index": {k: None if r is None else {**r, "completed_at": completed_at}
                                      for k, r in entries.items()}}


def visible(partition: str, history: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """What a reader must see for one key after `history` (None = key tombstone), oldest first."""
    if partition == "files":
        live: dict[str, int] = {}
        for r in history:
            if r is None:
                live = {}
                continue
            if r["is_deleted"]:
                live = {}
            for name, e in r["files"].items():
                if e["is_deleted"]:
                    live.pop(name, None)
                else:
                    live[name] = max(live.get(name, 0), e["size"])
        return {"files": {n: {"size": s, "is_deleted": False} for n, s in live.items()},
                "is_deleted": False} if live else None
    if partition == "record_index":  # the latest completion wins, the later one on a tie
        versions = [RECORD_INDEX_TOMBSTONE if r is None else r for r in history]
        latest = max(range(len(versions)), key=lambda i: (versions[i]["completed_at"], i))
        return None if versions[latest]["is_deleted"] else versions[latest]
    if partition == "bloom_filter":
        return history[-1] if history and history[-1] is not None else None
    state = None
    for r in history:
        if r is None or r["is_deleted"]:
            state = None
        elif state is None:
            state = dict(r)
        else:
            state = {**state, "min_value": min(state["min_value"], r["min_value"]),
                     "max_value": max(state["max_value"], r["max_value"]),
                     **{k: state[k] + r[k] for k in ("null_count", "value_count", "total_size")}}
    return None if state is None else {k: v for k, v in state.items() if k != "resets"}


class Model:
    """Committed instants (time -> records), folded in instant order."""

    def __init__(self) -> None:
        self.commits: dict[str, dict[str, dict[str, Any]]] = {}

    def expected(self, partition: str) -> dict[str, dict[str, Any]]:
        histories: dict[str, list] = {}
        for time in sorted(self.commits):
            for key, record in self.commits[time].get(partition, {}).items():
                histories.setdefault(key, []).append(record)
        out = {}
        for key, history in histories.items():
            v = visible(partition, history)
            if v is not None:
                out[key] = v
        return out
