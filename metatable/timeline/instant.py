"""Instants: a time, an action and a state; the timeline file name is the serialization."""
from __future__ import annotations

import datetime as dt
import enum
import functools
import re
from dataclasses import dataclass

from metatable.errors import InvalidInputError

BOOTSTRAP_TIME = "00000000000000000"
_TIME_FORMAT = "%Y%m%d%H%M%S"
_TIME_RE = re.compile(r"^\d{17}$")


class Action(str, enum.Enum):
    COMMIT = "commit"
    DELTACOMMIT = "deltacommit"
    REPLACECOMMIT = "replacecommit"
    COMPACTION = "compaction"
    CLEAN = "clean"
    ROLLBACK = "rollback"
    INDEXING = "indexing"


DATA_ACTIONS = (Action.COMMIT, Action.DELTACOMMIT, Action.COMPACTION, Action.REPLACECOMMIT)  # write data files
WRITE_ACTIONS = (Action.COMMIT, Action.DELTACOMMIT)  # writes of records (not services)


class State(str, enum.Enum):
    REQUESTED = "requested"
    INFLIGHT = "inflight"
    COMPLETED = "completed"


def validate_time(time: str) -> str:
    if not isinstance(time, str) or not _TIME_RE.match(time):
        raise InvalidInputError(f"bad instant time {time!r}: expected 17 digits yyyyMMddHHmmssSSS")
    return time


def time_from_datetime(moment: dt.datetime) -> str:
    moment = moment.astimezone(dt.timezone.utc)
    return moment.strftime(_TIME_FORMAT) + f"{moment.microsecond // 1000:03d}"


Moment = str | dt.datetime | dt.date  # what `as_of` and `changes` take: `moment_time`


def moment_time(moment: Moment) -> str:
    """A moment as an instant time: an instant time as it is; a `datetime` (naive ones are UTC), or an ISO-8601
    string (`2026-11-26`, `2026-11-26T23:18:00`, with an offset or without: UTC), at millisecond precision."""
    if isinstance(moment, dt.datetime):
        return time_from_datetime(moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc))
    if isinstance(moment, dt.date):
        return time_from_datetime(dt.datetime(moment.year, moment.month, moment.day, tzinfo=dt.timezone.utc))
    if isinstance(moment, str) and _TIME_RE.match(moment):
        return moment
    if isinstance(moment, str):
        try:
            parsed = dt.datetime.fromisoformat(moment.strip().replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return moment_time(parsed)
    raise InvalidInputError(f"{moment!r} is not a moment: give an instant time (17 digits yyyyMMddHHmmssSSS, UTC), "
                            "an ISO-8601 time such as '2026-11-26T23:18:00Z', or a datetime")


def datetime_from_time(time: str) -> dt.datetime:
    validate_time(time)
    moment = dt.datetime.strptime(time[:14], _TIME_FORMAT).replace(tzinfo=dt.timezone.utc)
    return moment + dt.timedelta(milliseconds=int(time[14:]))


def nanoseconds_of(time: str) -> int:
    """An instant time as nanoseconds since the epoch (what `completed_at` in commit metadata counts)."""
    return int(datetime_from_time(time).timestamp() * 10**9)


def next_time(after: str | None, now: dt.datetime | None = None) -> str:
    """The current UTC time, or one millisecond past `after` if the clock has not moved on."""
    candidate = time_from_datetime(now or dt.datetime.now(dt.timezone.utc))
    if after is None or after == BOOTSTRAP_TIME or candidate > after:
        return candidate
    return time_from_datetime(datetime_from_time(after) + dt.timedelta(milliseconds=1))


@dataclass(frozen=True, order=True)
class Instant:
    """One state of one action at one time; sorts by time, then action, then state."""

    time: str
    action: Action
    state: State = State.COMPLETED

    def __post_init__(self) -> None:
        validate_time(self.time)
        object.__setattr__(self, "action", Action(self.action))
        object.__setattr__(self, "state", State(self.state))

    @property
    def file_name(self) -> str:
        if self.state is State.COMPLETED:
            return f"{self.time}.{self.action.value}"
        return f"{self.time}.{self.action.value}.{self.state.value}"

    @staticmethod
    def parse(file_name: str) -> Instant:
        """The instant a timeline file name stands for. Cached: a timeline is listed and parsed dozens of times
        per write, and names never change meaning (a write on a 185-instant timeline spent 0.25 s of 0.38 s
        parsing them before)."""
        return _parse(file_name)

    def to(self, state: State) -> Instant:
        return Instant(self.time, self.action, state)

    @property
    def is_completed(self) -> bool:
        return self.state is State.COMPLETED

    def __str__(self) -> str:
        return f"{self.time} {self.action.value} {self.state.value}"


@functools.lru_cache(maxsize=1 << 16)
def _parse(file_name: str) -> Instant:
    parts = file_name.split(".")
    try:
        if len(parts) == 2:
            return Instant(parts[0], Action(parts[1]), State.COMPLETED)
        if len(parts) == 3 and parts[2] != State.COMPLETED.value:
            return Instant(parts[0], Action(parts[1]), State(parts[2]))
    except ValueError:
        pass
    raise InvalidInputError(
        f"bad instant file name {file_name!r}: expected <17-digit time>.<action>[.requested|.inflight]"
    )
