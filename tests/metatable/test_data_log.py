import datetime as dt
import decimal

import pyarrow as pa
import pytest

from metatable.data_log import read_data_log, write_data_log
from metatable.errors import CorruptFileError
from metatable.storage import LocalStorage

SCHEMA = pa.schema([("i", pa.int64()), ("s", pa.string()), ("d", pa.date32()), ("m", pa.decimal128(10, 2)),
                    ("t", pa.timestamp("us")), ("b", pa.bool_()), ("_mt_record_key", pa.string()),
                    ("_mt_is_deleted", pa.bool_())])
ROWS = pa.Table.from_pylist([
    {"i": 1, "s": "x", "d": dt.date(2020, 1, 2), "m": decimal.Decimal("1.25"), "t": dt.datetime(2020, 1, 2, 3, 4, 5),
     "b": True, "_mt_record_key": "1", "_mt_is_deleted": False},
    {"i": None, "s": None, "d": None, "m": None, "t": None, "b": None, "_mt_record_key": "2", "_mt_is_deleted": True},
], schema=SCHEMA)


ENCODINGS = [("avro", "snappy"), ("parquet", "snappy"), ("arrow", "zstd"), ("arrow", "lz4"), ("arrow", "none")]


@pytest.mark.parametrize("fmt,codec", ENCODINGS)
def test_round_trip(tmp_path, fmt, codec):
    path = str(tmp_path / "log")
    write_data_log(LocalStorage(), path, "20240101000000000", ROWS, fmt, codec)
    instant, rows = read_data_log(LocalStorage(), path, SCHEMA)
    assert instant == "20240101000000000" and rows.equals(ROWS)


@pytest.mark.parametrize("fmt,codec", ENCODINGS)
def test_columns_read_and_missing_ones_filled(tmp_path, fmt, codec):
    """A reader asks for some columns, in its order, and for one the block was written without (a column
    added to the table since): that one reads as nulls."""
    path = str(tmp_path / "log")
    write_data_log(LocalStorage(), path, "20240101000000000", ROWS.drop_columns(["s"]), fmt, codec)
    wanted = pa.schema([SCHEMA.field("_mt_record_key"), SCHEMA.field("s"), SCHEMA.field("i")])
    _, rows = read_data_log(LocalStorage(), path, wanted)
    assert rows.schema == wanted
    assert rows.to_pydict() == {"_mt_record_key": ["1", "2"], "s": [None, None], "i": [1, None]}


@pytest.mark.parametrize("fmt,codec", ENCODINGS)
def test_truncated_block_is_named(tmp_path, fmt, codec):
    path = str(tmp_path / "log")
    write_data_log(LocalStorage(), path, "20240101000000000", ROWS, fmt, codec)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) - 30])
    with pytest.raises(CorruptFileError, match="log"):
        read_data_log(LocalStorage(), path, SCHEMA)


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_damaged_arrow_block_is_named(tmp_path, codec):
    """A flipped byte inside an Arrow block's data fails its CRC-32, where an uncompressed buffer would
    otherwise read as another value."""
    path = str(tmp_path / "log")
    write_data_log(LocalStorage(), path, "20240101000000000", ROWS, "arrow", codec)
    data = bytearray(open(path, "rb").read())
    at = data.index(b"ARROW1") + 200  # inside the IPC file, past its magic
    data[at] ^= 0x01
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptFileError, match="CRC-32"):
        read_data_log(LocalStorage(), path, SCHEMA)
