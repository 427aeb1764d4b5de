"""Page-level key lookups against plain set membership, on files laid out as base files are."""
from __future__ import annotations

from random import Random

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metatable.errors import CorruptFileError
from metatable.file_group.base_file_writer import write_base_file
from metatable.file_group.slice_reader import base_keys_present, key_column, read_base
from metatable.formats.key_pages import (KEYS_NUL_FREE, key_page_count, key_pages, key_pages_at_most, nul_free_metadata,
                                         parquet_footer, worth_probing, write_options)
from metatable.storage.local import LocalStorage
from metatable.storage.paths import TablePaths
from metatable.table_config import KEY_COLUMN, TableConfig

LOCAL = LocalStorage()

COUNTER = iter(range(10 ** 9))


def write_keys(directory, keys: list[str], *, codec: str = "lz4_raw", page_rows: int = 4,
               nullable: bool = True, row_group_size: int | None = None, version: str = "1.0") -> str:
    """A file sorted and encoded like a base file, with one payload column."""
    path = str(directory / f"f{next(COUNTER)}.parquet")
    field = pa.field(KEY_COLUMN, pa.string(), nullable=nullable)
    table = pa.table({KEY_COLUMN: pa.array(keys, pa.string()), "payload": pa.array(range(len(keys)))})
    table = table.cast(pa.schema([field, pa.field("payload", pa.int64())]))
    table = table.take(pc.sort_indices(table[KEY_COLUMN]))
    table = table.replace_schema_metadata(nul_free_metadata(table[KEY_COLUMN]))
    options = write_options(table, "zstd", codec, 1 << 10)
    options.update(data_page_size=None, write_batch_size=None, max_rows_per_page=page_rows)  # small pages
    pq.write_table(table, path, row_group_size=row_group_size, data_page_version=version, **options)
    return path


texts = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=12)
# long keys and keys built from other keys' PLAIN encodings, which fool a naive search
tricky = st.builds(lambda k, n: f"x{chr(len(k.encode()))}\x00\x00\x00{k}" * n, texts, st.integers(1, 2))
keys_st = st.lists(st.one_of(texts, tricky, st.text(min_size=250, max_size=300)), min_size=1, max_size=60,
                   unique=True)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=keys_st, probes=st.lists(texts, max_size=20), data=st.data())
def test_contains_equals_set_membership(tmp_path, keys, probes, data):
    codec = data.draw(st.sampled_from(["lz4_raw", "zstd", "snappy", "none"]))
    path = write_keys(tmp_path, keys, codec=codec, page_rows=data.draw(st.integers(1, 8)),
                      nullable=data.draw(st.booleans()), row_group_size=data.draw(st.sampled_from([None, 7])),
                      version=data.draw(st.sampled_from(["1.0", "2.0"])))
    present = data.draw(st.lists(st.sampled_from(keys), max_size=10))
    # prefixes and suffixes of stored keys sit right next to them in the pages
    near = [k[:-1] for k in present if len(k) > 1] + [k + "\x00" for k in present] + [k[1:] for k in present]
    wanted = list(dict.fromkeys(present + probes + [n for n in near if n]))
    pages = key_pages(LOCAL, path)
    assert pages is not None
    assert key_page_count(LOCAL, path) == pages.page_count  # counted from the offset indexes' heads alone
    found, read = pages.contains(wanted)
    stored = set(keys)
    assert found.tolist() == [k in stored for k in wanted]
    touched = {page for k in wanted for page in pages.candidate_pages(k.encode())}
    assert read == sum(pages.sizes[p] for p in touched)  # each page whose range admits a key, once


def test_the_fast_search_is_only_used_on_nul_free_files(tmp_path):
    clean = write_keys(tmp_path, ["a", "b", "c"])
    hidden = "\x03\x00\x00\x00abc"  # the PLAIN encoding of "abc" inside another key
    tricky = write_keys(tmp_path, ["a", "b", hidden])
    assert pq.read_metadata(clean).metadata[KEYS_NUL_FREE] == b"true"
    assert pq.read_metadata(tricky).metadata[KEYS_NUL_FREE] == b"false"
    assert key_pages(LOCAL, tricky).contains(["abc", hidden])[0].tolist() == [False, True]


def test_nul_free_reads_only_the_keys_in_view():
    def verdict(keys) -> bytes:
        return nul_free_metadata(keys)[KEYS_NUL_FREE]

    assert verdict(pa.array(["a\x00", "b", "c"]).slice(1)) == b"true"  # the NUL is outside the slice
    assert verdict(pa.array(["a", "b", "c\x00"]).slice(0, 2)) == b"true"
    assert verdict(pa.array(["a", "b\x00", "c"]).slice(1, 1)) == b"false"
    assert verdict(pa.chunked_array([["a", "b"], ["c\x00d"]])) == b"false"
    assert verdict(pa.chunked_array([["a"], []], pa.string())) == b"true"
    assert verdict(pa.array(["x", "y"], pa.large_string())) == b"true"
    assert verdict(pa.array(["x", "y" * (1 << 24)])) == b"false"  # too long for a 3-byte length prefix
    assert verdict(pa.array([], pa.string())) == b"true"


def test_reads_one_page_per_key(tmp_path):
    keys = [f"key-{i:06d}" for i in range(20_000)]
    path = write_keys(tmp_path, keys, page_rows=100)
    pages = key_pages(LOCAL, path)
    assert pages.page_count == key_page_count(LOCAL, path) == 200
    found, read = pages.contains(["key-000123", "key-019999", "key-0001235", "key-5"])
    assert found.tolist() == [True, True, False, False]
    assert read == pages.sizes[1] + pages.sizes[199]  # "key-0001235" shares page 1; "key-5" is past the end
    column_bytes = pq.read_metadata(path).row_group(0).column(0).total_compressed_size
    assert read < column_bytes / 50


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(count=st.integers(1, 6000), seed=st.integers(0, 1 << 16), longest=st.integers(1, 40),
       page_size=st.sampled_from([1 << 10, 3000, 8 << 10]), row_group_size=st.sampled_from([None, 700]))
def test_the_footer_bounds_the_key_pages_and_probing_decides_as_the_page_count_says(
        tmp_path, count, seed, longest, page_size, row_group_size):
    """Base files as `write_base_file` lays them out, keys of 1 to `longest` characters: the footer's bound is
    never below the pages the offset indexes count, so deciding from it first changes no decision."""
    rng = Random(seed)
    keys = sorted({"".join(rng.choices("ab09é", k=rng.randint(1, longest))) for _ in range(count)})
    table = pa.table({"payload": pa.array(range(len(keys))), KEY_COLUMN: pa.array(keys, pa.string())})
    path = str(tmp_path / f"b{next(COUNTER)}.parquet")
    pq.write_table(table, path, row_group_size=row_group_size,
                   **write_options(table, "zstd", "lz4_raw", page_size))
    pages = key_page_count(LOCAL, path)
    assert key_pages_at_most(parquet_footer(LOCAL, path).fields) >= pages
    for keys_probed in {1, pages // 2, pages // 2 + 1, len(keys)}:
        assert worth_probing(LOCAL, path, keys_probed) == (keys_probed <= pages // 2)


def test_files_without_a_usable_page_index_fall_back_to_the_column(tmp_path):
    keys = [f"k{i}" for i in range(50)]
    unsorted = str(tmp_path / "unsorted.parquet")
    pq.write_table(pa.table({KEY_COLUMN: keys[::-1]}), unsorted, write_page_index=True, max_rows_per_page=5,
                   use_dictionary=False)
    dictionary = str(tmp_path / "dictionary.parquet")
    pq.write_table(pa.table({KEY_COLUMN: keys}), dictionary, write_page_index=True)
    plain = str(tmp_path / "no_index.parquet")
    pq.write_table(pa.table({KEY_COLUMN: keys}), plain, use_dictionary=False)
    for path in (unsorted, dictionary, plain):
        assert key_pages(LOCAL, path) is None
        found, read = base_keys_present(LOCAL, path, pa.array(["k7", "k70"]))
        assert found.tolist() == [True, False] and read > 0


def test_many_candidates_read_the_whole_column(tmp_path):
    keys = [f"k{i:04d}" for i in range(1000)]
    path = write_keys(tmp_path, keys, page_rows=10)
    found, read = base_keys_present(LOCAL, path, pa.array(keys[:600] + ["zz"]))
    assert found.sum() == 600 and not found[-1]
    assert read == pq.read_metadata(path).row_group(0).column(0).total_compressed_size


def test_corrupt_files_name_the_file(tmp_path):
    path = write_keys(tmp_path, [f"k{i}" for i in range(100)], page_rows=10)
    pages = key_pages(LOCAL, path)
    data = bytearray(open(path, "rb").read())
    page = pages.candidate_pages(b"k35").start
    start = pages.offsets[page]
    data[start:start + pages.sizes[page]] = b"\xff" * pages.sizes[page]
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptFileError, match=str(path)):
        pages.contains(["k35"])
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(CorruptFileError, match="garbage.parquet"):
        key_pages(LOCAL, str(garbage))
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(data[-200:])  # the tail of a real file: its footer length points before the start
    with pytest.raises(CorruptFileError, match="truncated.parquet"):
        key_pages(LOCAL, str(truncated))


def test_read_base_reads_a_file_in_the_table_schema_and_one_that_lacks_a_column(tmp_path):
    """The direct read returns a file in the table's schema as it is; a file without one of the schema's
    columns (or with other types) is read into the schema, the missing column as nulls."""
    schema = pa.schema([pa.field("a", pa.int64()), pa.field("b", pa.string()),
                        pa.field(KEY_COLUMN, pa.string(), nullable=False)])
    full = pa.table({"a": [1, 2], "b": ["x", "y"], KEY_COLUMN: ["k1", "k2"]}, schema=schema)
    pq.write_table(full, tmp_path / "full.parquet", write_page_checksum=True)
    assert read_base(LOCAL, str(tmp_path / "full.parquet"), schema).equals(full)
    assert read_base(LOCAL, str(tmp_path / "full.parquet"), schema, columns=["b"]).to_pydict() == {"b": ["x", "y"]}
    narrow = pa.table({"a": pa.array([3], pa.int32()), KEY_COLUMN: ["k3"]})
    pq.write_table(narrow, tmp_path / "narrow.parquet", write_page_checksum=True)
    read = read_base(LOCAL, str(tmp_path / "narrow.parquet"), schema)
    assert read.schema.equals(schema) and read.to_pydict() == {"a": [3], "b": [None], KEY_COLUMN: ["k3"]}


@pytest.mark.parametrize("rows", [3, 60_000])  # kept (a small file group's keys), and too large to keep
def test_the_keys_a_base_file_writer_keeps_are_the_ones_a_read_finds(tmp_path, rows):
    config = TableConfig(pa.schema([("id", pa.int64()), ("v", pa.string())]), ("id",))
    ids = pa.array(range(rows, 0, -1), pa.int64())  # unsorted: the writer sorts them
    table = pa.table([ids, pc.cast(ids, pa.string()), pc.cast(ids, pa.string())], schema=config.storage_schema)
    written = write_base_file(LOCAL, TablePaths(str(tmp_path)), config, "20260101000000000", "p", "f1-0", table)
    path = str(tmp_path / "p" / written["file_name"])
    keys, stored = key_column(LOCAL, path)
    on_disk = pq.ParquetFile(path)
    expected = sorted(map(str, range(1, rows + 1)))
    assert keys.to_pylist() == on_disk.read([KEY_COLUMN])[KEY_COLUMN].to_pylist() == expected
    leaf = on_disk.schema_arrow.get_field_index(KEY_COLUMN)
    assert stored == on_disk.metadata.row_group(0).column(leaf).total_compressed_size
