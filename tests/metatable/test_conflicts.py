"""The one conflict function, at its own level: the outcome table and the check over concurrent actions."""
from __future__ import annotations

import itertools

import pytest

from metatable.conflicts import Committer, Concurrent, Outcome, check, outcome
from metatable.errors import ConflictError
from metatable.instant import Action, Instant, State

C, D, X, CL, R = Action.COMMIT, Action.DELTACOMMIT, Action.COMPACTION, Action.CLEAN, Action.REPLACECOMMIT
NONE, REHOME, CONFLICT = Outcome.NONE, Outcome.REHOME, Outcome.CONFLICT

WRITERS = {
    "mor-bucket": Committer(D, merge_on_read=True, index="bucket"),
    "mor-bloom": Committer(D, merge_on_read=True, index="bloom"),
    "cow-bucket": Committer(C, merge_on_read=False, index="bucket"),
    "cow-bloom": Committer(C, merge_on_read=False, index="bloom"),
    "compaction": Committer(X, merge_on_read=True),
    "clean": Committer(CL, merge_on_read=True),
}

# (this action, concurrent action) -> outcome when they share a file group; unshared is always NONE
SHARED = {
    ("mor-bucket", D): REHOME, ("mor-bucket", C): REHOME, ("mor-bucket", X): REHOME, ("mor-bucket", CL): NONE,
    ("mor-bucket", R): CONFLICT,
    ("mor-bloom", D): CONFLICT, ("mor-bloom", C): CONFLICT, ("mor-bloom", X): REHOME, ("mor-bloom", CL): NONE,
    ("mor-bloom", R): CONFLICT,
    ("cow-bucket", D): CONFLICT, ("cow-bucket", C): CONFLICT, ("cow-bucket", X): CONFLICT, ("cow-bucket", CL): NONE,
    ("cow-bucket", R): CONFLICT,
    ("cow-bloom", D): CONFLICT, ("cow-bloom", C): CONFLICT, ("cow-bloom", X): CONFLICT, ("cow-bloom", CL): NONE,
    ("cow-bloom", R): CONFLICT,
    **{(service, other): NONE for service in ("compaction", "clean") for other in (C, D, X, CL, R)},
}


@pytest.mark.parametrize("this,other,shared", [(w, a, s) for w, a, s in
                                                itertools.product(WRITERS, (C, D, X, CL, R), (True, False))])
def test_outcome_table(this, other, shared):
    assert outcome(WRITERS[this], other, shared) is (SHARED[(this, other)] if shared else NONE)


def concurrent(time, action, groups, files=(), completed=True):
    return Concurrent(Instant(time, action, State.COMPLETED if completed else State.REQUESTED), frozenset(groups),
                      tuple(files))


MINE = Instant("20260101000000000", D, State.INFLIGHT)


def test_check_rehomes_shared_groups_and_names_the_conflict():
    others = [concurrent("20260101000000001", D, {"p/a", "p/b"}),
              concurrent("20260101000000002", X, {"p/c"}, completed=False)]
    assert check(WRITERS["mor-bucket"], MINE, {"p/a", "p/c", "p/z"}, others) == {"p/a", "p/c"}
    with pytest.raises(ConflictError, match="deltacommit 20260101000000001.*p/a"):
        check(WRITERS["mor-bloom"], MINE, {"p/a", "p/c"}, others)
    assert check(WRITERS["mor-bloom"], MINE, {"p/q"}, others) == set()


def test_check_probes_keys_only_against_completed_writes():
    probed = []

    def shared_keys(writes):
        probed.append([w.instant.time for w in writes])
        return []

    others = [concurrent("20260101000000001", D, {"p/x"}, ["p/x_1.parquet"]),
              concurrent("20260101000000002", X, {"p/y"}, completed=False),
              concurrent("20260101000000003", CL, set())]
    assert check(WRITERS["mor-bloom"], MINE, {"p/new"}, others, shared_keys) == set()
    assert probed == [["20260101000000001"]]
    assert check(WRITERS["compaction"], MINE, {"p/x"}, others, shared_keys) == set()
    assert len(probed) == 1, "services never probe keys"
    with pytest.raises(ConflictError, match="stored 2 keys that a concurrent write stored too"):
        check(WRITERS["cow-bloom"], MINE, {"p/new"}, others, lambda writes: ["k1", "k2"])
