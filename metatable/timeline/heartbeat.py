"""Heartbeats of inflight instants, so that a dead writer's instant can be found and rolled back.

A beat rewrites `<heartbeats>/<instant>`; its age is judged by the storage's own clock (`Storage.ages`: the
file's modification time against the store's now), never by comparing the clock of the process that beat with
the clock of the one that looks: on an object store the two are different hosts.
"""
from __future__ import annotations

import os
import threading
import time

from metatable.errors import StorageError
from metatable.storage.base import Storage


class Heartbeat:
    """Rewrites `<heartbeats>/<instant>` every `interval_s` from a daemon thread while running."""

    def __init__(self, storage: Storage, directory: str, instant_time: str, interval_s: float) -> None:
        self.storage = storage
        self.path = os.path.join(directory, instant_time)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        self.storage.write_atomic(self.path, str(time.time()).encode())  # the time is for people: ages are the store's

    def start(self) -> Heartbeat:
        """Beat every `interval_s` from now; the instant's first beat was written when it was made or claimed."""
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{os.path.basename(self.path)}",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except (OSError, StorageError):  # the table may be going away; the writer reports its own errors
                return

    def stop(self, remove: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if remove:
            self.storage.delete(self.path)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def is_expired(ages: dict[str, float], instant_time: str, interval_s: float, misses: int) -> bool:
    """True when the instant's writer stopped beating (or never started) long enough ago; `ages` are the
    heartbeat directory's (`Storage.ages`)."""
    age = ages.get(instant_time)
    return age is None or age > interval_s * misses
