"""Random interleavings of upserts, deletes, compaction schedules, compaction runs and SIGKILLed writers
and compactions (real child processes), against the dict model."""
from __future__ import annotations

import shutil
import signal
import tempfile
import time

import pyarrow as pa
import pytest
from hypothesis import Phase, event, given, settings, strategies as st

import metatable as mt
from metatable.timeline.instant import Action

from .strategies import rows_strategy
from .table_model import SCHEMA, TableModel, check_metadata, sort_rows
from .test_write_concurrency import act, finished

FAST = {"heartbeat.interval_s": 0.05, "heartbeat.tolerable_misses": 2, "clean.retain_commits": 2}
WRITE_POINTS = ["table.write.files", "metadata.write.log", "table.commit.metadata", "metadata.complete",
                "table.commit"]
COMPACTION_POINTS = ["table.compaction.files", "table.commit.metadata", "table.commit"]

step_strategy = st.one_of(
    st.tuples(st.sampled_from(["upsert"] * 4 + ["delete"]), rows_strategy),
    st.tuples(st.sampled_from(["schedule", "schedule", "run", "compact"])),
    st.tuples(st.just("crash_write"), rows_strategy, st.sampled_from(WRITE_POINTS)),
    st.tuples(st.just("crash_compaction"), st.sampled_from(["compact", "run_compaction"]),
              st.sampled_from(COMPACTION_POINTS)),
)

def data_of(operation: str, batch: list[dict]) -> pa.Table:
    data = pa.Table.from_pylist(batch, schema=SCHEMA)
    return data.select(["id", "p"]) if operation == "delete" else data


@pytest.mark.slow
@settings(max_examples=7, deadline=None, phases=[Phase.generate, Phase.shrink])  # 10 examples: 25-55 s of the suite
@given(seed=st.lists(rows_strategy, min_size=2, max_size=2), steps=st.lists(step_strategy, min_size=3, max_size=10),
       partitioned=st.booleans(), buckets=st.integers(1, 3))
def test_interleavings_equal_the_model(seed, steps, partitioned, buckets):
    root = tempfile.mkdtemp(prefix="mt-interleave-")
    try:
        table = mt.Table.create(f"{root}/t", SCHEMA, "id", "p" if partitioned else None, "ts",
                                table_type="merge_on_read", index=mt.IndexConfig(num_buckets=buckets), options=FAST)
        table = mt.Table.open(table.path, options=FAST)
        model = TableModel(partitioned)
        recovered = True
        for step in [("upsert", batch) for batch in seed] + steps:
            kind = step[0]
            if kind in ("upsert", "delete"):
                if table.context.timeline.pending([Action.COMPACTION]):
                    event("a write while a compaction is pending")
                getattr(table, kind)(data_of(kind, step[1]))
                model.apply(kind, step[1])
                recovered = True
            elif kind == "schedule":
                table.schedule_compaction()
            elif kind == "run":
                table.run_compaction()
                recovered = True
            elif kind == "compact":
                table.compact()
                recovered = True
            else:
                operation, batch, point = (step[1] and "upsert", step[1], step[2]) if kind == "crash_write" \
                    else (step[1], [], step[2])
                code, out, err = finished(act(table.path, operation, batch, FAST, METATABLE_CRASH_AT=point))
                assert code in (0, -signal.SIGKILL), out + err
                event(f"{operation} killed" if code else f"{operation} not killed")
                if code == 0 and operation == "upsert":
                    model.apply("upsert", batch)
                time.sleep(0.15)  # the dead process's heartbeat expires
                recovered = False
            table.metadata.refresh()
            assert sort_rows(table.to_arrow().to_pylist()) == model.expected(), step
            if recovered:
                check_metadata(table)
        table.rollback()
        table.run_compaction()
        assert not table.context.timeline.pending()
        assert sort_rows(mt.Table.open(table.path).to_arrow().to_pylist()) == model.expected()
        check_metadata(table)
    finally:
        shutil.rmtree(root, ignore_errors=True)
