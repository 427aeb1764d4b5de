"""A MetadataTable driven through random histories, checked against a plain dict model."""
from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from metatable.errors import RollbackError
from metatable.metadata.table import MetadataTable
from metatable.timeline.instant import Action

from .models import RECORDS, Model, stamped

PARTITIONS = {"files": 2, "bloom_filter": 1, "column_stats": 3, "record_index": 2}
KEYS = st.sampled_from(["k1", "k10", "k2", "k20", "x", "x1"])
PREFIXES = ["", "k", "k1", "k2", "x", "zz"]


def records_for(partition: str):
    return st.dictionaries(KEYS, st.one_of(st.none(), RECORDS[partition]), min_size=1, max_size=4)


batches = st.fixed_dictionaries({}, optional={p: records_for(p) for p in PARTITIONS}).filter(bool)


class MetadataTableMachine(RuleBasedStateMachine):
    pending = Bundle("pending")

    @initialize(max_deltas=st.integers(1, 4), retain=st.integers(1, 3))
    def create(self, max_deltas, retain):
        self.dir = tempfile.mkdtemp(prefix="mdt-stateful-")
        self.options = {"metadata.compact.max_delta_commits": max_deltas,
                        "metadata.clean.retain_file_slices": retain,
                        "heartbeat.interval_s": 3600.0}  # pending instants stay alive until rolled back here
        self.mdt = MetadataTable.create(f"{self.dir}/m", PARTITIONS, options=self.options)
        self.model = Model()
        self.pending_records: dict[str, dict] = {}
        self.writes = 0  # record_index entries complete in write order

    def teardown(self):
        if hasattr(self, "mdt"):
            self.mdt.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def stamped(self, batch):
        self.writes += 1
        return stamped(batch, self.writes)

    @rule(batch=batches)
    def commit(self, batch):
        batch = self.stamped(batch)
        self.model.commits[self.mdt.commit(batch)] = batch

    @rule(target=pending, batch=batches)
    def start_without_completing(self, batch):
        batch = self.stamped(batch)
        time = self.mdt.begin()
        self.mdt.write(time, batch)
        self.pending_records[time] = batch
        return time

    @rule(time=consumes(pending))
    def complete_pending(self, time):
        self.mdt.complete(time)
        self.mdt.refresh()
        self.model.commits[time] = self.pending_records.pop(time)

    @rule(time=consumes(pending))
    def roll_back_pending(self, time):
        self.mdt.rollback(time)
        self.pending_records.pop(time)

    @rule(data=st.data())
    def roll_back_completed(self, data):
        if not self.model.commits:
            return
        time = data.draw(st.sampled_from(sorted(self.model.commits)))
        try:
            self.mdt.rollback(time)
        except RollbackError:
            assert any(c.time > time for c in self.mdt.timeline.instants() if c.action is Action.COMPACTION)
            return
        del self.model.commits[time]

    @rule(force=st.booleans())
    def compact(self, force):
        self.mdt.compact(force=force)

    @rule()
    def clean(self):
        self.mdt.clean()

    @rule()
    def reopen(self):
        self.mdt.close()
        self.mdt = MetadataTable.open(f"{self.dir}/m")

    @rule(partition=st.sampled_from(sorted(PARTITIONS)), keys=st.lists(KEYS, max_size=6))
    def get_many(self, partition, keys):
        expected = self.model.expected(partition)
        wanted = {k: expected[k] for k in keys if k in expected}
        assert self.mdt.get_many(partition, keys) == wanted
        for k in keys[:2]:
            assert self.mdt.get(partition, k) == expected.get(k)
        fresh = MetadataTable.open(f"{self.dir}/m")  # decodes only these keys' log entries (no scan before)
        assert fresh.get_many(partition, keys) == wanted
        fresh.close()

    @invariant()
    def scans_match_model(self):
        if not hasattr(self, "mdt"):
            return
        for partition in PARTITIONS:
            expected = self.model.expected(partition)
            for prefix in PREFIXES:
                assert list(self.mdt.scan(partition, prefix)) == \
                    sorted((k, v) for k, v in expected.items() if k.startswith(prefix))


# 200 examples took 18-32 s of the suite
MetadataTableMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=20, deadline=None)
TestMetadataTable = MetadataTableMachine.TestCase
