"""Column stats of a base file: min and max from the Parquet footer for strings and bytes, from Arrow
for the rest; both agree with Arrow over the rows."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import indexes.column_stats as column_stats
from indexes.column_stats import file_column_stats

text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
rows = st.lists(st.tuples(st.none() | text, st.none() | st.binary(max_size=8), st.none() | st.integers(-9, 9)),
                max_size=30)


def written(tmp_path, table: pa.Table, row_group_size: int) -> pq.FileMetaData:
    collected: list[pq.FileMetaData] = []
    pq.write_table(table, tmp_path / "f.parquet", row_group_size=row_group_size, metadata_collector=collected)
    return collected[0]


def stats(table: pa.Table, metadata: pq.FileMetaData | None) -> dict:
    out = file_column_stats(table, table.column_names, "p", "f.parquet", metadata)
    return {record["column_name"]: (record["min_value"], record["max_value"], record["null_count"])
            for record in out.values()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=rows, row_group_size=st.integers(1, 8))
def test_min_max_from_the_footer_equal_arrows(tmp_path, rows, row_group_size):
    """Strings and bytes take their min and max from the Parquet footer, the rest from Arrow: both agree with
    Arrow over the rows, whatever the row groups (some all null) hold."""
    table = pa.table({"s": pa.array([r[0] for r in rows], pa.string()),
                      "b": pa.array([r[1] for r in rows], pa.binary()),
                      "i": pa.array([r[2] for r in rows], pa.int64())})
    metadata = written(tmp_path, table, row_group_size)
    assert stats(table, metadata) == stats(table, None)


def test_fixed_vectors(tmp_path):
    table = pa.table({"s": ["b", None, "aé", "z", None], "b": [b"x", b"\xff", None, b"a", None]})
    metadata = written(tmp_path, table, 2)  # the last row group holds nulls only
    assert stats(table, metadata) == {"s": ("aé", "z", 2), "b": (b"a", b"\xff", 2)}
    nulls = pa.table({"s": pa.array([None, None], pa.string())})
    assert stats(nulls, written(tmp_path, nulls, 1)) == {"s": (None, None, 2)}


def test_strings_are_not_compared_again_when_the_footer_has_them(tmp_path, monkeypatch):
    table = pa.table({"s": ["b", None, "a", "z"], "i": [3, 1, None, 2]})
    metadata = written(tmp_path, table, 2)
    arrow_min_max = column_stats.pc.min_max
    seen = []
    monkeypatch.setattr(column_stats.pc, "min_max", lambda column: seen.append(column.type) or arrow_min_max(column))
    assert stats(table, metadata) == {"s": ("a", "z", 1), "i": (1, 3, 1)}
    assert seen == [pa.int64()]


def test_values_too_long_for_the_footer_come_from_arrow(tmp_path):
    """The Parquet writer leaves out min and max past its statistics size (4 KB), never truncating them;
    such a column is compared by Arrow."""
    long_a, long_b = "a" * 5000 + "z", "b" * 5000
    table = pa.table({"s": [long_a, "b", "a" * 5000 + "y", long_b]})
    metadata = written(tmp_path, table, 2)
    assert not metadata.row_group(0).column(0).statistics.has_min_max
    assert stats(table, metadata) == {"s": ("a" * 5000 + "y", long_b, 0)}
