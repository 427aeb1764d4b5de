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


@pytest.mark.parametrize("fmt", ["avro", "parquet"])
def test_round_trip(tmp_path, fmt):
    path = str(tmp_path / "log")
    write_data_log(LocalStorage(), path, "20240101000000000", ROWS, fmt, "snappy")
    instant, rows = read_data_log(LocalStorage(), path, SCHEMA)
    assert instant == "20240101000000000" and rows.equals(ROWS)


@pytest.mark.parametrize("fmt", ["avro", "parquet"])
def test_truncated_block_is_named(tmp_path, fmt):
    path = str(tmp_path / "log")
    write_data_log(LocalStorage(), path, "20240101000000000", ROWS, fmt, "snappy")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) - 30])
    with pytest.raises(CorruptFileError, match="log"):
        read_data_log(LocalStorage(), path, SCHEMA)
