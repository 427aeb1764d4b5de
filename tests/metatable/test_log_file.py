import pytest

from metatable.errors import CorruptFileError
from metatable.log_file import BlockKind, LogBlock, read_log, write_log
from metatable.storage import LocalStorage

S = LocalStorage()


def block(n=100):
    return LogBlock("20240101000000000", BlockKind.RECORDS, [(f"k{i:04d}", bytes([i % 256]) * 30) for i in range(n)])


def test_round_trip(tmp_path):
    path = str(tmp_path / ".f-0000_00000000000000000.log.1_t")
    write_log(S, path, block())
    got = read_log(S, path)
    assert got == block()


def test_rollback_block(tmp_path):
    path = str(tmp_path / "r")
    write_log(S, path, LogBlock("20240101000000001", BlockKind.ROLLBACK, [], target_instant="20240101000000000"))
    assert read_log(S, path).target_instant == "20240101000000000"


@pytest.mark.parametrize("cut", [10, 200, -40, -1])
def test_truncation_is_detected_and_named(tmp_path, cut):
    path = str(tmp_path / "log")
    write_log(S, path, block())
    data = open(path, "rb").read()
    open(path, "wb").write(data[:cut])
    with pytest.raises(CorruptFileError, match="log"):
        read_log(S, path)


def test_garbage(tmp_path):
    path = str(tmp_path / "log")
    open(path, "wb").write(b"\x00garbage" * 100)
    with pytest.raises(CorruptFileError, match=str(path)):
        read_log(S, path)
