"""The one conflict function, at its own level: the outcome table and the check over concurrent actions."""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from metatable.commit.conflicts import Committer, Concurrent, Outcome, Resolution, check, outcome
from metatable.errors import ClusteringConflict, ConflictError
from metatable.timeline.instant import Action, Instant, State

C, D, X, CL, R = Action.COMMIT, Action.DELTACOMMIT, Action.COMPACTION, Action.CLEAN, Action.REPLACECOMMIT
NONE, REHOME, CONFLICT, ABORT = Outcome.NONE, Outcome.REHOME, Outcome.CONFLICT, Outcome.ABORT_OTHER

WRITERS = {
    "mor-bucket": Committer(D, merge_on_read=True, index="bucket"),
    "mor-bloom": Committer(D, merge_on_read=True, index="bloom"),
    "cow-bucket": Committer(C, merge_on_read=False, index="bucket"),
    "cow-bloom": Committer(C, merge_on_read=False, index="bloom"),
    "mor-bloom-abort": Committer(D, merge_on_read=True, index="bloom", updates="abort_clustering"),
    "cow-bloom-abort": Committer(C, merge_on_read=False, index="bloom", updates="abort_clustering"),
    "compaction": Committer(X, merge_on_read=True),
    "clean": Committer(CL, merge_on_read=True),
    "clustering": Committer(R, merge_on_read=True),
    "clustering-abort": Committer(R, merge_on_read=True, updates="abort_clustering"),
    "cow-clustering-abort": Committer(R, merge_on_read=False, updates="abort_clustering"),
}
# the concurrent action: (action, pending, a rehash)
OTHERS = {"commit": (C, False, False), "deltacommit": (D, False, False), "compaction": (X, True, False),
          "clean": (CL, False, False), "clustering-done": (R, False, False), "clustering-pending": (R, True, False),
          "rehash-done": (R, False, True), "rehash-pending": (R, True, True), "write-inflight": (D, True, False)}

# (this action, concurrent action) -> outcome when they share a file group; unshared is NONE except for a rehash
SHARED = {
    **{(w, o): CONFLICT for w in ("mor-bloom", "cow-bucket", "cow-bloom", "cow-bloom-abort", "mor-bloom-abort")
       for o in ("commit", "deltacommit")},
    ("mor-bucket", "commit"): REHOME, ("mor-bucket", "deltacommit"): REHOME,
    **{(w, "compaction"): REHOME for w in ("mor-bucket", "mor-bloom", "mor-bloom-abort")},
    **{(w, "compaction"): CONFLICT for w in ("cow-bucket", "cow-bloom", "cow-bloom-abort")},
    **{(w, "clustering-done"): REHOME for w in ("mor-bucket", "mor-bloom", "mor-bloom-abort")},
    **{(w, "clustering-done"): CONFLICT for w in ("cow-bucket", "cow-bloom", "cow-bloom-abort")},
    **{(w, "clustering-pending"): CONFLICT for w in ("mor-bucket", "mor-bloom", "cow-bucket", "cow-bloom")},
    **{(w, "clustering-pending"): ABORT for w in ("mor-bloom-abort", "cow-bloom-abort")},
    **{(w, "rehash-done"): CONFLICT for w in ("mor-bucket", "mor-bloom", "cow-bucket", "cow-bloom", "mor-bloom-abort",
                                              "cow-bloom-abort")},
    **{(w, "rehash-pending"): CONFLICT for w in ("mor-bucket", "mor-bloom", "cow-bucket", "cow-bloom")},
    **{(w, "rehash-pending"): ABORT for w in ("mor-bloom-abort", "cow-bloom-abort")},
    ("clustering", "commit"): CONFLICT, ("clustering", "deltacommit"): CONFLICT,
    ("clustering-abort", "commit"): CONFLICT, ("clustering-abort", "deltacommit"): CONFLICT,
    ("cow-clustering-abort", "commit"): CONFLICT, ("cow-clustering-abort", "deltacommit"): CONFLICT,
    # abort_clustering yields to an inflight write that would fail on meeting it completed (copy-on-write); a
    # merge-on-read write re-homes its logs, so the clustering commits
    ("cow-clustering-abort", "write-inflight"): CONFLICT,
}


@pytest.mark.parametrize("this,other,shared", list(itertools.product(WRITERS, OTHERS, (True, False))))
def test_outcome_table(this, other, shared):
    action, pending, rehash = OTHERS[other]
    expected = SHARED.get((this, other), NONE) if shared or (rehash and WRITERS[this].action in (C, D)) else NONE
    assert outcome(WRITERS[this], action, shared, pending, rehash) is expected


def test_a_rehash_shares_every_file_group_with_writes():
    rehash = Committer(R, merge_on_read=True, updates="abort_clustering", rehash=True)
    assert outcome(rehash, D, False, pending=True) is CONFLICT  # it yields to any inflight write
    assert outcome(replace(rehash, updates="reject"), D, False, pending=True) is NONE
    assert outcome(rehash, X, False, pending=True) is NONE


@pytest.mark.parametrize("merge_on_read", [True, False])
def test_consistent_hashing_writes_and_resizes_never_conflict(merge_on_read):
    """They meet through dual writes; writes keep every other rule (copy-on-write writers still conflict)."""
    for writer in (C, D):
        this = Committer(writer, merge_on_read, dual_writes=True)
        for pending in (True, False):
            assert outcome(this, R, True, pending) is NONE
        assert outcome(this, C, True) is (REHOME if merge_on_read else CONFLICT)
    resize = Committer(R, merge_on_read, dual_writes=True, updates="abort_clustering")
    for writer in (C, D):
        assert outcome(resize, writer, True) is NONE
        assert outcome(resize, writer, True, pending=True) is NONE


def concurrent(time, action, groups, files=(), completed=True):
    return Concurrent(Instant(time, action, State.COMPLETED if completed else State.REQUESTED), frozenset(groups),
                      tuple(files))


MINE = Instant("20260101000000000", D, State.INFLIGHT)


def test_check_rehomes_shared_groups_and_names_the_conflict():
    others = [concurrent("20260101000000001", D, {"p/a", "p/b"}),
              concurrent("20260101000000002", X, {"p/c"}, completed=False)]
    assert check(WRITERS["mor-bucket"], MINE, {"p/a", "p/c", "p/z"}, others).rehome == {"p/a", "p/c"}
    with pytest.raises(ConflictError, match="deltacommit 20260101000000001.*p/a"):
        check(WRITERS["mor-bloom"], MINE, {"p/a", "p/c"}, others)
    assert check(WRITERS["mor-bloom"], MINE, {"p/q"}, others) == Resolution()


def test_check_probes_keys_only_against_completed_writes():
    probed = []

    def shared_keys(writes):
        probed.append([w.instant.time for w in writes])
        return []

    others = [concurrent("20260101000000001", D, {"p/x"}, ["p/x_1.parquet"]),
              concurrent("20260101000000002", X, {"p/y"}, completed=False),
              concurrent("20260101000000003", CL, set())]
    assert check(WRITERS["mor-bloom"], MINE, {"p/new"}, others, shared_keys) == Resolution()
    assert probed == [["20260101000000001"]]
    assert check(WRITERS["compaction"], MINE, {"p/x"}, others, shared_keys) == Resolution()
    assert len(probed) == 1, "services never probe keys"
    with pytest.raises(ConflictError, match="stored 2 keys that a concurrent write stored too"):
        check(WRITERS["cow-bloom"], MINE, {"p/new"}, others, lambda writes: ["k1", "k2"])


def test_check_names_the_clustering_and_aborts_it_when_writes_win():
    pending = [concurrent("20260101000000001", R, {"p/a"}, completed=False)]
    with pytest.raises(ClusteringConflict, match="clustering 20260101000000001") as raised:
        check(WRITERS["mor-bloom"], MINE, {"p/a"}, pending)
    assert raised.value.clustering == "20260101000000001"
    resolution = check(WRITERS["mor-bloom-abort"], MINE, {"p/a"}, pending)
    assert [i.time for i in resolution.abort] == ["20260101000000001"]
    done = [concurrent("20260101000000001", R, {"p/a"})]
    assert check(WRITERS["mor-bloom"], MINE, {"p/a"}, done).rehome == {"p/a"}
    with pytest.raises(ClusteringConflict):
        check(WRITERS["cow-bloom"], MINE, {"p/a"}, done)
