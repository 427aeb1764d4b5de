import datetime as dt

import pytest
from hypothesis import given, strategies as st

from metatable.errors import InvalidInputError
from metatable.timeline.instant import Action, Instant, State, next_time, time_from_datetime


def test_file_names_round_trip():
    for state in State:
        i = Instant("20240102030405678", Action.DELTACOMMIT, state)
        assert Instant.parse(i.file_name) == i
    assert Instant("20240102030405678", Action.COMMIT).file_name == "20240102030405678.commit"
    assert Instant("20240102030405678", Action.CLEAN, State.INFLIGHT).file_name == "20240102030405678.clean.inflight"


@pytest.mark.parametrize("bad", ["2024.commit", "20240102030405678.nope", "20240102030405678.commit.completed",
                                 "x0240102030405678.commit", "20240102030405678.commit.requested.x"])
def test_bad_names_are_named_in_the_error(bad):
    with pytest.raises(InvalidInputError, match="bad instant"):
        Instant.parse(bad)


def test_next_time_is_strictly_increasing():
    now = dt.datetime(2024, 1, 1, 0, 0, 0, 999000, tzinfo=dt.timezone.utc)
    t = time_from_datetime(now)
    assert t == "20240101000000999"
    assert next_time(t, now) == "20240101000001000"
    assert next_time("20240101000000500", now) == t


@given(st.lists(st.datetimes(min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2100, 1, 1)), min_size=1))
def test_next_time_never_repeats(moments):
    last = None
    for m in moments:
        t = next_time(last, m.replace(tzinfo=dt.timezone.utc))
        assert last is None or t > last
        assert len(t) == 17
        last = t
