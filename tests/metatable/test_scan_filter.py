import datetime as dt
import decimal

import pyarrow as pa
import pytest

import metatable as mt
from metatable.errors import InvalidInputError
from metatable.read.scan_filter import may_match

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("d", pa.date32()), ("amount", pa.decimal128(10, 2))])


@pytest.mark.parametrize("op,value,lo,hi,expected", [
    ("==", 5, 1, 4, False), ("==", 3, 1, 4, True), ("<", 1, 1, 4, False), ("<=", 1, 1, 4, True),
    (">", 4, 1, 4, False), (">=", 4, 1, 4, True), ("!=", 2, 2, 2, False), ("in", [0, 9], 1, 4, False),
    ("in", [0, 3], 1, 4, True), ("==", 3, None, None, True),
    ("<", dt.date(2020, 1, 1), {"days": dt.date(2020, 1, 1)}, {"days": dt.date(2021, 1, 1)}, False),
    (">=", decimal.Decimal("9.5"), 1.0, 9.25, False),
])
def test_may_match(op, value, lo, hi, expected):
    assert may_match(op, value, lo, hi) is expected


def test_reads_skip_files_and_stay_exact(tmp_path, spark):
    table = mt.Table.create(str(tmp_path / "t"), SCHEMA, "id", "p", table_type="copy_on_write",
                            index=mt.IndexConfig(num_buckets=1))
    rows = [{"id": i, "p": f"x{i // 10}", "d": dt.date(2020, 1, 1) + dt.timedelta(days=i),
             "amount": decimal.Decimal(i) / 4} for i in range(50)]
    table.upsert(pa.Table.from_pylist(rows, schema=SCHEMA))
    got = table.to_arrow(filter=[("id", ">=", 42)])
    assert sorted(got["id"].to_pylist()) == list(range(42, 50))
    assert table.last_scan == {"partitions": 5, "partitions_skipped": 0, "file_slices": 5, "skipped": 4}
    got = table.read(filter=[("d", "<", dt.date(2020, 1, 5)), ("p", "==", "x0")]).collect()
    assert sorted(r.id for r in got) == [0, 1, 2, 3]
    assert table.last_scan == {"partitions": 5, "partitions_skipped": 4, "file_slices": 1, "skipped": 0}
    assert table.to_arrow(filter=[("amount", ">", decimal.Decimal("100"))]).num_rows == 0
    with pytest.raises(InvalidInputError, match="filter column 'nope'"):
        table.to_arrow(filter=[("nope", "==", 1)])
