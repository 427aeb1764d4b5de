"""The merge of a file slice's versions against a plain model of the merge rules (docs: Merge rules)."""
from __future__ import annotations

from random import Random

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from metatable.file_group.record_merge import merge_each, merge_versions, newest_versions
from metatable.file_group.slice_reader import keys_of_logs
from metatable.table_config import DELETED_COLUMN, KEY_COLUMN

SCHEMA = pa.schema([(KEY_COLUMN, pa.string()), ("ts", pa.int64()), ("v", pa.string())])
LOG_SCHEMA = SCHEMA.append(pa.field(DELETED_COLUMN, pa.bool_()))

keys = st.sampled_from([f"k{i}" for i in range(8)])
version = st.fixed_dictionaries({"ts": st.one_of(st.none(), st.integers(0, 3)), "v": st.text(max_size=2),
                                 DELETED_COLUMN: st.booleans(), "reset": st.booleans()})
# a part holds each key at most once, as every base file and log block does, except that a log block may hold
# a delete of a key beside its row (a change feed's record deleted and inserted again: "reset")
part = st.dictionaries(keys, version, max_size=6)


def model(parts: list[dict[str, dict]], ordering: str | None) -> dict[str, tuple]:
    """Per key: the versions after its last delete (a reset row's part deletes it first); of those the greatest
    ordering value (nulls lowest), ties going to the later part; gone when none is left."""
    out = {}
    for key in {k for p in parts for k in p}:
        versions = [(seq, p[key]) for seq, p in enumerate(parts) if key in p]
        last_delete = max((seq for seq, row in versions if row[DELETED_COLUMN] or row["reset"]), default=-1)
        alive = [(seq, row) for seq, row in versions if not row[DELETED_COLUMN] and (
            seq > last_delete or (seq == last_delete and row["reset"]))]
        if alive:
            def rank(item):
                seq, row = item
                value = row[ordering] if ordering else None
                return (value is not None, value or 0, seq)
            row = max(alive, key=rank)[1]
            out[key] = (row["ts"], row["v"])
    return out


def as_tables(parts: list[dict[str, dict]], shuffle: Random | None = None) -> list[pa.Table]:
    """The first part as a base file (no deleted flag, live rows only, sorted), the rest as log blocks (in
    key order, or shuffled)."""
    tables = []
    for i, p in enumerate(parts):
        rows = [{KEY_COLUMN: k, **r} for k, r in sorted(p.items())]
        rows += [{KEY_COLUMN: r[KEY_COLUMN], DELETED_COLUMN: True} for r in rows
                 if r["reset"] and not r[DELETED_COLUMN]]
        if i and shuffle:
            shuffle.shuffle(rows)
        if i == 0:
            rows = [{c: r[c] for c in SCHEMA.names} for r in rows if not r[DELETED_COLUMN]]
            tables.append(pa.Table.from_pylist(rows, schema=SCHEMA))
        else:
            tables.append(pa.Table.from_pylist(rows, schema=LOG_SCHEMA))
    return tables


# ordering types whose values order as the model's integers 0-3 do, each by a path of casts from int64
ORDERING_TYPES = {"int64": [], "float64": [pa.float64()], "string": [pa.string()], "date32": [pa.int32(), pa.date32()],
                  "timestamp": [pa.timestamp("us", "UTC")], "decimal": [pa.float64(), pa.decimal128(5, 1)]}


def with_ts_cast(table: pa.Table, path: list[pa.DataType]) -> pa.Table:
    ts = table["ts"]
    for t in path:
        ts = ts.cast(t)
    return table.set_column(table.schema.get_field_index("ts"), pa.field("ts", ts.type), ts)


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(part, min_size=1, max_size=4), ordered=st.booleans(), shuffle=st.none() | st.randoms(),
       ordering_type=st.sampled_from(sorted(ORDERING_TYPES)))
def test_merge_equals_the_model(parts, ordered, shuffle, ordering_type):
    parts[0] = {k: {**r, DELETED_COLUMN: False, "reset": False} for k, r in parts[0].items()}  # no deletes
    ordering = "ts" if ordered else None
    path = ORDERING_TYPES[ordering_type]
    tables = [with_ts_cast(t, path) for t in as_tables(parts, shuffle)]
    merged = merge_versions(tables, ordering, tables[0].schema)
    merged = with_ts_cast(merged, [*reversed(path[:-1]), pa.int64()])  # back to the model's integers
    got = {r[KEY_COLUMN]: (r["ts"], r["v"]) for r in merged.to_pylist()}
    assert merged.num_rows == len(got), "one row per key"
    assert got == model(parts, ordering)


@settings(max_examples=300, deadline=None)
@given(slices=st.lists(st.lists(part, min_size=1, max_size=4), min_size=1, max_size=5), ordered=st.booleans(),
       shuffle=st.none() | st.randoms())
def test_slices_merged_together_equal_the_model_of_each(slices, ordered, shuffle):
    """Several slices merged at once (`merge_each`, as a read or a compaction of many slices does), their keys
    drawn from one alphabet so that slices share keys: each slice's rows are its own merge, in its own table.
    A slice whose base is empty takes the general merge, the others are ranked together."""
    ordering = "ts" if ordered else None
    for parts in slices:
        parts[0] = {k: {**r, DELETED_COLUMN: False, "reset": False} for k, r in parts[0].items()}
    versions = [as_tables(parts, shuffle) for parts in slices]
    merged = merge_each(versions, ordering, SCHEMA)
    assert len(merged) == len(slices)
    for parts, rows in zip(slices, merged):
        got = {r[KEY_COLUMN]: (r["ts"], r["v"]) for r in rows.to_pylist()}
        assert rows.num_rows == len(got), "one row per key"
        assert got == model(parts, ordering)


@settings(max_examples=300, deadline=None)
@given(logs=st.lists(part, min_size=1, max_size=5), shuffle=st.none() | st.randoms())
def test_the_keys_of_logs_equal_the_model(logs, shuffle):
    """Which keys a slice's logs touch and which they leave alive, folded a block at a time, against the
    merge model over the same blocks (no base, no ordering field: existence only)."""
    blocks = as_tables([{}, *logs], shuffle)[1:]
    touched, alive = keys_of_logs(blocks)
    assert set(touched.to_pylist()) == {k for log in logs for k in log}
    assert sorted(alive.to_pylist()) == sorted(model([{}, *logs], None))  # each alive key once


def test_newest_versions_leaves_deletes_and_repeated_keys_to_the_general_merge():
    base = pa.table({KEY_COLUMN: ["a", "b"], "ts": [1, 1], "v": ["x", "y"]}, schema=SCHEMA)
    deletes = pa.table({KEY_COLUMN: ["a"], "ts": [None], "v": [None], DELETED_COLUMN: [True]}, schema=LOG_SCHEMA)
    repeats = pa.table({KEY_COLUMN: ["b", "b"], "ts": [2, 3], "v": ["p", "q"], DELETED_COLUMN: [False, False]},
                       schema=LOG_SCHEMA)
    assert newest_versions([base, deletes], SCHEMA) is None
    assert newest_versions([base, repeats], SCHEMA) is None
    updates = pa.table({KEY_COLUMN: ["b", "c"], "ts": [0, 0], "v": ["z", "w"], DELETED_COLUMN: [False, False]},
                       schema=LOG_SCHEMA)
    newest = newest_versions([base, updates], SCHEMA)
    assert sorted(newest.to_pylist(), key=lambda r: r[KEY_COLUMN]) == [
        {KEY_COLUMN: "a", "ts": 1, "v": "x"}, {KEY_COLUMN: "b", "ts": 0, "v": "z"},
        {KEY_COLUMN: "c", "ts": 0, "v": "w"}]


def test_stored_values_of_a_file_group_the_snapshot_lacks_are_null(tmp_path):
    """An upsert whose index placed keys in a file group its snapshot does not have yet (the chaos soak: a
    record index current to a clustering that completed after the write began) counts nothing as stale
    instead of failing."""
    from metatable.file_group.slice_reader import stored_values
    from metatable.storage.local import LocalStorage
    from metatable.storage.paths import TablePaths
    from metatable.table_config import TableConfig

    config = TableConfig(pa.schema([("id", pa.int64()), ("ts", pa.int64())]), ("id",), ordering_field="ts")
    got = stored_values(LocalStorage(), TablePaths(str(tmp_path)), config, None, pa.array(["1", "2"]), "ts",
                        above=0)
    assert got.to_pylist() == [None, None] and got.type == pa.int64()
