"""Heartbeats of inflight instants, so that a dead writer's instant can be found and rolled back."""
from __future__ import annotations

import os
import threading
import time

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
        self.storage.write_atomic(self.path, str(time.time()).encode())

    def start(self) -> Heartbeat:
        self.beat()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{os.path.basename(self.path)}",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except OSError:  # the table may be going away; the writer reports its own errors
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


def last_beat(storage: Storage, directory: str, instant_time: str) -> float | None:
    path = os.path.join(directory, instant_time)
    try:
        return float(storage.read(path).decode())
    except (FileNotFoundError, ValueError):
        return None


def is_expired(storage: Storage, directory: str, instant_time: str, interval_s: float, misses: int,
               now: float | None = None) -> bool:
    """True when the instant's writer stopped beating (or never started) long enough ago."""
    beat = last_beat(storage, directory, instant_time)
    if beat is None:
        return True
    return (now or time.time()) - beat > interval_s * misses
