"""A write allocates from Arrow's jemalloc pool and puts the process's pool back when it ends; a process
that chose its pool (`ARROW_DEFAULT_MEMORY_POOL`) keeps it."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pyarrow as pa

import metatable as mt
from metatable.arrow_memory import BULK_POOL, bulk_memory


def test_a_write_allocates_from_the_bulk_pool_and_restores_the_default():
    before = pa.default_memory_pool().backend_name
    assert before != BULK_POOL
    with bulk_memory():
        assert pa.default_memory_pool().backend_name == BULK_POOL
        inside = pa.array(range(1000))
    assert pa.default_memory_pool().backend_name == before
    assert pa.concat_arrays([inside, pa.array(range(10))]).to_pylist() == [*range(1000), *range(10)]


def test_overlapping_writes_restore_the_default_only_when_the_last_ends():
    before = pa.default_memory_pool().backend_name
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[str] = []

    def first() -> None:
        with bulk_memory():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with bulk_memory():
            second_in.set()
            first_out.wait(10)
            seen.append(pa.default_memory_pool().backend_name)  # the first write has ended, this one runs

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == [BULK_POOL]
    assert pa.default_memory_pool().backend_name == before


def test_a_write_through_the_api_leaves_the_process_pool_as_it_was(tmp_path):
    before = pa.default_memory_pool().backend_name
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    table = mt.Table.create(str(tmp_path / "t"), schema, "id", options={"write.spill_bytes": 0})
    table.bulk_insert(pa.table({"id": range(100), "v": [str(i) for i in range(100)]}, schema=schema))
    assert pa.default_memory_pool().backend_name == before
    assert table.to_arrow().num_rows == 100


def test_a_process_that_chose_its_pool_keeps_it():
    code = textwrap.dedent("""
        import pyarrow as pa
        from metatable.arrow_memory import bulk_memory
        with bulk_memory():
            print(pa.default_memory_pool().backend_name)
    """)
    for chosen in ("system", "mimalloc"):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ARROW_DEFAULT_MEMORY_POOL": chosen},
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip() == chosen
