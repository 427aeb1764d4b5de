"""The keys of the file slices a streamed write counts its rows against, read while the stream still arrives.

A writer that tells inserts from updates (a counted merge-on-read upsert; an insert or delete on a bucket
index) reads each touched slice's key column and its logs' keys. Those reads need no row of the batch, only
the names of the file groups it touches, and a stream names them chunk by chunk: Spark's rows moving into
the Python worker of a small write, a Parquet file read in chunks. One thread reads them while later chunks
arrive, and the file group's writer takes what it read instead of reading again. A base file's key column is
read only where the writer would read it whole (`worth_probing` says not to probe its pages), and only up to
`write.prefetch_key_bytes` of key columns held at once.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa

from metatable.file_group.file_slice import FileSlice
from metatable.file_group.slice_reader import base_path, key_column, log_keys, members
from metatable.formats.key_pages import worth_probing
from metatable.write.write_task import WriteTask

FileGroupKey = tuple[str, str]  # (partition, file id)


@dataclass(frozen=True)
class SliceKeys:
    """What a slice says about existence, read ahead: its base's key column (None where the writer probes
    the base's pages itself) and its logs' touched and alive keys (None without logs)."""

    base: pa.ChunkedArray | None
    logs: tuple[pa.ChunkedArray, pa.ChunkedArray] | None

    def in_base(self, candidates: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
        return None if self.base is None else members(candidates, self.base)

    def in_logs(self, candidates: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray] | None:
        return None if self.logs is None else tuple(members(candidates, keys) for keys in self.logs)

    @property
    def nbytes(self) -> int:
        return (self.base.nbytes if self.base is not None else 0) + sum(k.nbytes for k in self.logs or ())


class KeyPrefetch:
    """Reads ahead the slice keys of every file group a stream's held chunks name (`see`), for the writers
    to `take`. Closing waits for the read in progress and forgets what no writer took."""

    def __init__(self, task: WriteTask) -> None:
        self.task = task
        reads = task.reads_slice_keys and task.slices  # a load into an empty table has nothing to read
        self.budget = task.config.options["write.prefetch_key_bytes"] if reads else 0
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="metatable-prefetch") if self.budget else None
        self.pending: dict[FileGroupKey, Future[SliceKeys]] = {}
        self.held_bytes = 0  # read ahead and not yet taken
        self.lock = threading.Lock()

    def __enter__(self) -> KeyPrefetch:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.pending.clear()

    def see(self, groups: Sequence[tuple[FileGroupKey, np.ndarray]]) -> None:
        """A held chunk's file groups (each with its rows' indices): the reads of those not seen before start."""
        if self.pool is None:
            return
        for key, rows in groups:
            fs = self.task.slices.get(key)
            if fs is not None and key not in self.pending:
                self.pending[key] = self.pool.submit(self._read, fs, len(rows))

    def _read(self, fs: FileSlice, seen_keys: int) -> SliceKeys:
        """The slice's keys as its writer would read them for `seen_keys` or more keys: a base's key column only
        where that writer would read it whole, and while the budget lasts."""
        path = base_path(self.task.paths, fs)
        storage = self.task.storage
        whole = path is not None and self.held_bytes < self.budget and not worth_probing(storage, path, seen_keys)
        keys = SliceKeys(key_column(storage, path)[0] if whole else None,
                         log_keys(storage, self.task.paths, self.task.config, fs) if fs.logs else None)
        with self.lock:
            self.held_bytes += keys.nbytes
        return keys

    def take(self, key: FileGroupKey) -> SliceKeys | None:
        """What was read ahead for the file group; None if nothing was, or if its read has not started (the
        writer reads sooner itself than after the reads queued before)."""
        future = self.pending.pop(key, None)
        if future is None or future.cancel():
            return None
        keys = future.result()
        with self.lock:
            self.held_bytes -= keys.nbytes
        return keys
