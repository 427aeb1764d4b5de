"""Clustering against the dict model: random upserts, deletes, compactions, clustering schedules and runs,
cleans, SIGKILLed clusterings and time-travel reads, for both table types and both index types."""
from __future__ import annotations

import shutil
import signal
import tempfile
import time

import pyarrow as pa
import pytest
from hypothesis import Phase, event, given, settings, strategies as st

import metatable as mt
from metatable.errors import ClusteringConflict
from metatable.timeline.instant import DATA_ACTIONS, WRITE_ACTIONS, Action

from .strategies import rows_strategy
from .table_model import SCHEMA, TableModel, check_metadata, sort_rows
from .test_write_concurrency import act, finished

OPTIONS = {"heartbeat.interval_s": 0.05, "heartbeat.tolerable_misses": 2, "clean.retain_commits": 3,
           "clean.inline": False, "write.target_file_size": 3000, "clustering.small_file_limit": 1 << 20,
           "clustering.max_bytes_per_group": 9000}
CLUSTERING_POINTS = ["table.clustering.files", "table.commit.metadata", "table.commit"]

step_strategy = st.one_of(
    st.tuples(st.sampled_from(["upsert"] * 4 + ["delete"]), rows_strategy),
    st.tuples(st.sampled_from(["schedule", "run", "cluster", "cluster_sorted", "compact", "clean"])),
    st.tuples(st.just("crash_clustering"), st.sampled_from(CLUSTERING_POINTS)),
)


def data_of(operation: str, batch: list[dict]) -> pa.Table:
    data = pa.Table.from_pylist(batch, schema=SCHEMA)
    return data.select(["id", "p"]) if operation == "delete" else data


def check_views(table: mt.Table, models: dict[str, list[dict]]) -> None:
    """The snapshot hides replaced file groups; every retained instant reads as the model did then."""
    view = table.context.view()
    assert not set(view.file_slices) & view.replaced
    completed = [i.time for i in table.context.timeline.completed(DATA_ACTIONS)]
    writes = sorted(models)
    for instant in completed[-OPTIONS["clean.retain_commits"]:]:
        # time travel is by instant time: a service that completed after later writes shows the writes
        # up to its own time (this test's writes complete in time order)
        expected = models[max(w for w in writes if w <= instant)]
        assert sort_rows(table.to_arrow(as_of=instant).to_pylist()) == expected, instant
        past = table.context.view(instant)
        assert not set(past.file_slices) & past.replaced


@pytest.mark.slow
@settings(max_examples=12, deadline=None, phases=[Phase.generate, Phase.shrink])  # 16 examples: 26-42 s of the suite
@given(seed=st.lists(rows_strategy, min_size=3, max_size=3), steps=st.lists(step_strategy, min_size=3, max_size=10),
       table_type=st.sampled_from(["merge_on_read", "copy_on_write"]), index=st.sampled_from(["bloom", "bucket"]),
       updates=st.sampled_from(["reject", "abort_clustering"]))
def test_clustering_equals_the_model(seed, steps, table_type, index, updates):
    root = tempfile.mkdtemp(prefix="mt-cluster-")
    try:
        mt.Table.create(f"{root}/t", SCHEMA, "id", "p", "ts", table_type=table_type,
                        index=mt.IndexConfig(type=index, num_buckets=2),
                        metadata_indexes=["column_stats", "bloom_filter"], options=OPTIONS)
        table = mt.Table.open(f"{root}/t", options={**OPTIONS, "clustering.updates": updates})
        model = TableModel(partitioned=True)
        models: dict[str, list[dict]] = {}
        for step in [("upsert", batch) for batch in seed] + steps:
            kind = step[0]
            if kind in ("upsert", "delete"):
                pending = table.context.timeline.pending([Action.REPLACECOMMIT])
                try:
                    getattr(table, kind)(data_of(kind, step[1]))
                    model.apply(kind, step[1])
                    event(f"write while clustering pending ({updates})" if pending else "write")
                except ClusteringConflict as e:  # the write touched a file group under the pending clustering
                    assert pending and updates == "reject" and e.clustering == pending[0].time
                    event("write rejected by a pending clustering")
            elif kind == "schedule":
                event("scheduled" if table.schedule_clustering(sort_columns=["v"] if index == "bucket" else None)
                      else "nothing to schedule")
            elif kind == "run":
                table.run_clustering()
            elif kind in ("cluster", "cluster_sorted"):
                done = table.cluster(sort_columns=["v"] if kind == "cluster_sorted" else None)
                event(f"{kind}: {'done' if done else 'nothing'}")
            elif kind == "compact":
                table.compact()
            elif kind == "clean":
                table.clean()
            else:
                code, out, err = finished(act(table.path, "cluster", [], {**OPTIONS, "clustering.sort_columns": "v"},
                                              METATABLE_CRASH_AT=step[1]))
                assert code in (0, -signal.SIGKILL), out + err
                event(f"clustering killed at {step[1]}" if code else "clustering not killed (nothing to do)")
                time.sleep(0.15)  # the dead process's heartbeat expires
                table.run_clustering()  # resumes it
            table.metadata.refresh()
            for i in table.context.timeline.completed(WRITE_ACTIONS):
                models.setdefault(i.time, model.expected())
            assert sort_rows(table.to_arrow().to_pylist()) == model.expected(), step
            check_metadata(table)
            check_views(table, models)
        table.run_clustering()  # what the last step scheduled
        assert table.cluster(sort_columns=["v"]) is not None or not table.file_slices()  # the next one succeeds
        assert sort_rows(table.to_arrow().to_pylist()) == model.expected()
        check_metadata(table)
    finally:
        shutil.rmtree(root, ignore_errors=True)
