"""Tables that live for years (issue 37): services that run themselves keep every commit's cost flat."""
from __future__ import annotations

import pyarrow as pa
import pytest

import metatable as mt
from metatable.timeline.instant import Action

from .table_model import SCHEMA, TableModel, sort_rows


def small_upserts(t: mt.Table, model: TableModel, commits: int) -> int:
    """Upserts of 3 keys each, all landing in the same few file groups; returns the most logs a slice had."""
    most = 0
    for n in range(commits):
        rows = [{"id": (n * 3 + i) % 20, "p": "a", "v": f"v{n}", "ts": n} for i in range(3)]
        t.upsert(pa.Table.from_pylist(rows, schema=SCHEMA))
        model.apply("upsert", rows)
        most = max(most, max(len(fs.logs) for fs in t.file_slices().values()))
    return most


def new_table(tmp_path, **options) -> mt.Table:
    return mt.Table.create(str(tmp_path / "t"), SCHEMA, ["id"], ["p"], "ts", index=mt.IndexConfig(num_buckets=2),
                           options=options)


def test_a_table_left_alone_compacts_the_file_groups_whose_logs_pass_the_trigger(tmp_path):
    t, model = new_table(tmp_path), TableModel(True)
    most = small_upserts(t, model, 40)
    assert most <= t.config.options["compaction.trigger.log_count"]
    assert [i for i in t.timeline() if i.action is Action.COMPACTION and i.is_completed]
    assert sort_rows(t.to_arrow().to_pylist()) == model.expected()


def test_a_byte_trigger_compacts_before_the_count_does(tmp_path):
    t, model = new_table(tmp_path, **{"compaction.trigger.log_count": 0, "compaction.trigger.log_bytes": 4096}), \
        TableModel(True)
    most = small_upserts(t, model, 30)
    assert most < 10
    assert sort_rows(t.to_arrow().to_pylist()) == model.expected()


@pytest.mark.parametrize("mode", ["schedule", "off"])
def test_scheduled_compaction_is_left_to_another_process_and_off_does_nothing(tmp_path, mode):
    t, model = new_table(tmp_path, **{"compaction.mode": mode, "compaction.trigger.log_count": 4}), TableModel(True)
    small_upserts(t, model, 20)
    compactions = [i for i in t.timeline() if i.action is Action.COMPACTION]
    assert all(not i.is_completed for i in compactions)
    if mode == "off":
        assert not compactions
        return
    assert compactions, "the trigger scheduled a compaction"
    assert t.run_compaction() == [i.time for i in compactions]
    assert sort_rows(t.to_arrow().to_pylist()) == model.expected()
