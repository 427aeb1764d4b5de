import os

import pytest

from metatable.errors import CorruptFileError, MissingFileError
from metatable.formats.sst_file import SstCache, write_sst
from metatable.storage.local import LocalStorage

S = LocalStorage()


def items(n):
    return [(f"k{i:06d}".encode(), f"v{i}".encode()) for i in range(n)]


def test_write_and_read(tmp_path):
    path = str(tmp_path / "b.sst")
    assert write_sst(S, path, items(1000)) == 1000
    cache = SstCache(LocalStorage(), str(tmp_path / "cache"))
    r = cache.reader(path)
    assert r.get(b"k000010") == b"v10"
    assert r.get(b"nope") is None
    assert r.get_many([b"k000001", b"x", b"k000999"]) == [b"v1", None, b"v999"]
    assert [k for k, _ in r.scan(b"k00001")] == [f"k{i:06d}".encode() for i in range(10, 20)]
    assert r.min_key() == b"k000000" and r.max_key() == b"k000999"
    assert cache.reader(path) is r  # warm


def test_ingest_links_and_keeps_the_base(tmp_path):
    path = str(tmp_path / "b.sst")
    write_sst(S, path, items(100))
    before = open(path, "rb").read()
    SstCache(LocalStorage(), str(tmp_path / "cache")).reader(path)
    assert open(path, "rb").read() == before
    assert os.stat(path).st_nlink == 2  # hard-linked into the read cache, not copied


def test_changed_file_is_not_served_stale(tmp_path):
    path = str(tmp_path / "b.sst")
    write_sst(S, path, [(b"a", b"1")])
    cache = SstCache(LocalStorage(), str(tmp_path / "cache"))
    assert cache.reader(path).get(b"a") == b"1"
    write_sst(S, path, [(b"a", b"2")])
    assert cache.reader(path).get(b"a") == b"2"


def test_cache_shared_across_instances(tmp_path):
    path = str(tmp_path / "b.sst")
    write_sst(S, path, items(10))
    SstCache(LocalStorage(), str(tmp_path / "cache")).reader(path)
    other = SstCache(LocalStorage(), str(tmp_path / "cache"))
    assert other.reader(path).get(b"k000003") == b"v3"
    assert len([n for n in os.listdir(tmp_path / "cache") if not n.startswith(".")]) == 1


def test_empty_writes_nothing(tmp_path):
    path = str(tmp_path / "b.sst")
    assert write_sst(S, path, []) == 0
    assert not os.path.exists(path)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("damage", ["garbage", "truncate"])
def test_corrupt_sst_is_named(tmp_path, damage):
    path = str(tmp_path / "b.sst")
    write_sst(S, path, items(1000))
    data = open(path, "rb").read()
    open(path, "wb").write(b"not an sst" * 100 if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(CorruptFileError, match="b.sst"):
        SstCache(LocalStorage(), str(tmp_path / "cache")).reader(path)


def test_a_read_cache_removed_while_another_process_opens_it_is_a_missing_file_naming_the_sst(tmp_path):
    """Found by the chaos run: a metadata clean in another process removed the cache entry of a base file
    while a reader opened it, and the reader died of RocksDB's raw `IO error: No such file or directory`."""
    path = str(tmp_path / "base.sst")
    write_sst(LocalStorage(), path, [(b"a", b"1")])
    cache = SstCache(LocalStorage(), str(tmp_path / "cache"))
    os.makedirs(os.path.join(cache.root, cache.entry_name(path)))  # the entry, its files already removed
    with pytest.raises(MissingFileError, match="base.sst: its read cache was removed while in use"):
        cache.reader(path)
