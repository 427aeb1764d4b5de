"""Which Arrow memory pool a write or a whole-table read allocates from, and giving its freed memory back after.

pyarrow's default pool is mimalloc, which reserves its arena with `MADV_HUGEPAGE`: on a machine whose
transparent huge pages are `madvise`, a process's first big growth spends its time in the kernel zeroing
2 MB pages (perf of the in-process SF 1 load: 27% of all samples in `clear_page_erms`). Arrow's jemalloc
pool does not, so a write allocates from it: SF 1 in-process load from a Parquet path, new process each run,
4 alternated runs each: 6.9-7.2 s with mimalloc, 6.1-6.3 s with jemalloc (4.1 -> 2.3 s of system time).
So does `to_arrow`, which holds the whole table: the first full read of the workload benchmark's table in a
fresh process took 0.37-0.64 s with mimalloc, 0.39-0.40 s with jemalloc, a second one while the first's
rows were held 0.30-0.43 s against 0.25 s (three fresh processes each); in a process that had just run
writes (on jemalloc), the first reads 0.43-0.50 and 0.42-0.44 s against 0.35 and 0.24-0.25 s.
The pool is switched for the write or read only, and not at all where the process chose one
(`ARROW_DEFAULT_MEMORY_POOL`): it is process-wide state that the user's own code shares. Buffers remember
the pool they came from, so arrays made before, during and after mix freely.
"""
from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from typing import Iterator

import pyarrow as pa

log = logging.getLogger(__name__)

BULK_POOL = "jemalloc"  # also what Spark's Python workers are started with (spark.session.spark_session)

_lock = threading.Lock()
_users = 0  # writes and reads in progress in this process: the first switches the pool, the last restores it
_restore: pa.MemoryPool | None = None


def bulk_pool() -> pa.MemoryPool | None:
    """The pool a write or a whole read should switch to, or None to keep the default (chosen by the
    process, or already the bulk pool, or jemalloc not built into this pyarrow)."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL") or pa.default_memory_pool().backend_name == BULK_POOL:
        return None
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        log.debug("pyarrow has no jemalloc pool; writes and reads allocate from %s",
                  pa.default_memory_pool().backend_name)
        return None


@contextmanager
def bulk_memory() -> Iterator[None]:
    """Allocate from the bulk pool while the block runs, then return its freed pages: a pool keeps them
    for reuse, and after an SF 1 load from a Parquet path the process stayed at 2.0 GB RSS (0 bytes
    allocated) until they were returned, 0.2 GB after. A Spark worker that kept them would hold them into
    the next write. That was mimalloc's; Arrow's jemalloc (the bulk pool) gives its pages back from a
    background thread over the next ~1 s, and this call does not hurry it (an SF 1 load into 7 file groups:
    1.0 GB resident when it returned, the call made; the same after calling it again; 0.26 GB 1.1 s later)."""
    global _users, _restore
    with _lock:
        if _users == 0:
            pool = bulk_pool()
            if pool is not None:
                _restore = pa.default_memory_pool()
                pa.set_memory_pool(pool)
        _users += 1
        used = pa.default_memory_pool()
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _restore is not None:
                pa.set_memory_pool(_restore)
                _restore = None
        used.release_unused()
