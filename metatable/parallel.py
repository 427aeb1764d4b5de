"""Short parallel steps (the pages of a `get`, the slices of a lookup) on one pool of threads per process.

A pool started for each call costs its threads' start and join: ~0.75 ms for two threads and four trivial
tasks against ~0.06 ms on a pool kept (this machine), and a `get_by` of ~30 rows started three or four
pools (py-spy: 11% of its main thread in `Thread.start` and the joins). So these steps share one pool,
started on first use and forgotten in a forked child, whose threads do not survive the fork.

A task of the pool that maps on the pool would wait for threads that are all waiting like it: a map called
from one of the pool's threads gets a pool of its own, as every call did before. Long jobs (a write's file
groups, a compaction, a streamed scan) keep pools of their own (`worker_pool`); they pay the start once for
seconds of work.

Small work runs in the calling thread (`parallel=False`): most of a row read's work holds the GIL (building
the small Parquet files of its pages), and each call that releases it (a page's read, a decode) then waits
to take it back. A `get_by` of one (l_suppkey, l_shipdate) pair at SF 1 (~1 row) took 4.1-4.2 ms warm on
the pool and 3.3-3.4 ms in its own thread; one of ~30 rows (`l_partkey`) 23.5-25.0 ms on the pool, 25.2 ms in
one thread. So reads of fewer rows than `row_pages.FEW_ROWS` decode in the caller's thread.

The threads of every pool here say so (`arrow_threads`): a Parquet file decoded in one of them is decoded
without Arrow's own threads, since ours keep the cores busy already.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Iterable, TypeVar

from metatable.config import THREADS

T = TypeVar("T")
R = TypeVar("R")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_inside = threading.local()  # `ours` set in every pool's threads here, `shared` in the shared pool's


def thread_map(fn: Callable[[T], R], items: Iterable[T], parallel: bool = True) -> list[R]:
    """`[fn(item) for item in items]`, THREADS at a time. Every task has ended when it returns or raises (the
    first error in the items' order is raised): a task left running could use what the caller closes next.
    `parallel` False: in this thread, one after another, for work too small to gain from threads."""
    items = list(items)
    if len(items) < 2 or THREADS < 2 or not parallel:
        return [fn(item) for item in items]
    if getattr(_inside, "shared", False):
        with worker_pool(THREADS, "metatable-nested") as pool:
            return list(pool.map(fn, items))
    futures = [_shared().submit(fn, item) for item in items]
    wait(futures)
    return [future.result() for future in futures]


def worker_pool(threads: int, name: str) -> ThreadPoolExecutor:
    """A pool of its own, for a long job, whose threads are ours (`arrow_threads`)."""
    return ThreadPoolExecutor(threads, thread_name_prefix=name, initializer=_mark, initargs=(False,))


def arrow_threads() -> bool:
    """Whether a Parquet decode in this thread should use Arrow's thread pool: not in a thread of ours. A
    base file of 94k rows (SF 1) read alone took 13.4 ms with it and 24 ms without; read by two threads of
    ours, the workload benchmark's 480 files of ~3,400 rows took 0.28-0.29 s with it and 0.24-0.27 s
    without, SF 1's 56 files 1.32-1.35 s and 1.19-1.24 s."""
    return not getattr(_inside, "ours", False)


def _shared() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADS, thread_name_prefix="metatable-pool", initializer=_mark,
                                       initargs=(True,))
        return _pool


def _mark(shared: bool) -> None:
    _inside.ours, _inside.shared = True, shared


def _forget_in_child() -> None:
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
