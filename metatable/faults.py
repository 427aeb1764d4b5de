"""Named fault points for failure testing.

`METATABLE_CRASH_AT=<point>[:<n>]` makes the process SIGKILL itself the n-th
time (default first) it reaches `point`; `METATABLE_PAUSE_AT=<point>:<seconds>`
makes it sleep there (to hold two writers in a chosen interleaving), and
`METATABLE_PAUSE_AT=<point>:<file>` holds it there until `file` exists, having
created `<file>.reached` (the test acts at once instead of sleeping long
enough; the heartbeat keeps beating meanwhile, as it does in a sleep);
`METATABLE_STOP_AT=<point>` makes it SIGSTOP itself there, every thread at once,
as a long GC pause or a frozen VM would (whoever started it sends SIGCONT).
Unset (always, outside tests) each is a dictionary lookup and nothing more.
"""
from __future__ import annotations

import os
import signal
import time

_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    pause = os.environ.get("METATABLE_PAUSE_AT")
    if pause:
        point, _, until = pause.partition(":")
        if point == name:
            _pause(until or "1")
    if os.environ.get("METATABLE_STOP_AT") == name:
        os.kill(os.getpid(), signal.SIGSTOP)
    spec = os.environ.get("METATABLE_CRASH_AT")
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def _pause(until: str) -> None:
    """Sleep `until` seconds, or, when it is a file's path, until that file exists (at most 10 minutes)."""
    try:
        time.sleep(float(until))
        return
    except ValueError:
        pass
    with open(until + ".reached", "w"):
        pass
    deadline = time.monotonic() + 600
    while not os.path.exists(until) and time.monotonic() < deadline:
        time.sleep(0.01)
