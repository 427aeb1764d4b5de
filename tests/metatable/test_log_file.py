import base64
import io
import zlib

import fastavro
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from avro_schemas import schema

from metatable.errors import CorruptFileError
from metatable.formats.log_file import (
    ENTRY_LENGTHS, BlockKind, LogBlock, avro_long, entries_of_block, read_log, write_log)
from metatable.storage.local import LocalStorage

S = LocalStorage()


def block(n=100):
    return LogBlock("20240101000000000", BlockKind.RECORDS, [(f"k{i:04d}", bytes([i % 256]) * 30) for i in range(n)])


def written(tmp_path, entries, name="log"):
    path = str(tmp_path / name)
    write_log(S, path, LogBlock("20240101000000000", BlockKind.RECORDS, entries))
    return path


def test_round_trip(tmp_path):
    path = str(tmp_path / ".f-0000_00000000000000000.log.1_t")
    write_log(S, path, block())
    got = read_log(S, path)
    assert (got.instant, got.kind, got.target_instant) == ("20240101000000000", BlockKind.RECORDS, None)
    assert got.entries.pairs() == block().entries


def test_lengths_of_every_varint_width(tmp_path):
    """Lengths of 0, 63/64 (one and two varint bytes), 8191/8192 (two and three) and a non-ASCII key."""
    entries = [("", b""), ("a" * 63, b"x" * 64), ("b" * 64, b"y" * 8191), ("ключ-é", b"z" * 8192), ("k", b"\x00")]
    assert read_log(S, written(tmp_path, entries)).entries.pairs() == entries


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=80), st.binary(max_size=300)), max_size=40))
def test_read_equals_fastavros_reading(tmp_path_factory, entries):
    """The columnar read against fastavro's own record reader of the same file."""
    path = written(tmp_path_factory.mktemp("log"), entries)
    with open(path, "rb") as f:
        expected = [(r["key"], r["value"]) for r in fastavro.reader(f)]
    assert read_log(S, path).entries.pairs() == expected == entries


def test_a_body_with_bytes_left_over_or_missing_is_an_error():
    body = b"\x02k\x02v"  # one entry: key "k", value b"v"
    assert entries_of_block(body, 1).pairs() == [("k", b"v")]
    with pytest.raises(ValueError, match="after the last"):
        entries_of_block(body + b"\x00", 1)
    with pytest.raises(IndexError):
        entries_of_block(body, 2)
    with pytest.raises(ValueError, match="negative length"):
        entries_of_block(b"\x01\x02v", 1)


def test_rollback_block(tmp_path):
    path = str(tmp_path / "r")
    write_log(S, path, LogBlock("20240101000000001", BlockKind.ROLLBACK, [], target_instant="20240101000000000"))
    assert read_log(S, path).target_instant == "20240101000000000"


def test_entries_of_another_schema_are_an_error(tmp_path):
    path = str(tmp_path / "log")
    buf = io.BytesIO()
    fastavro.writer(buf, {"type": "record", "name": "R", "fields": [{"name": "key", "type": "long"}]}, [{"key": 1}],
                    metadata={"metatable.instant": "20240101000000000", "metatable.block_kind": "records",
                              "metatable.count": "1"})
    open(path, "wb").write(buf.getvalue())
    with pytest.raises(CorruptFileError, match="not \\(key: string, value: bytes\\)"):
        read_log(S, path)


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


def rewritten(path, entry_lengths):
    """The same file with the header's entry lengths replaced (None: as a writer that did not list them, as
    before they were, would have written it)."""
    with open(path, "rb") as f:
        reader = fastavro.block_reader(f)
        meta = {k: v for k, v in reader.metadata.items() if k != ENTRY_LENGTHS and not k.startswith("avro.")}
        (data_block,) = list(reader)
        body, count = data_block.bytes_.getvalue(), data_block.num_records
    if entry_lengths is not None:
        meta[ENTRY_LENGTHS] = base64.b64encode(zlib.compress(np.array(entry_lengths, dtype="<u4").tobytes())).decode()
    sync = b"s" * 16
    buf = io.BytesIO()
    fastavro.writer(buf, schema("log_entry"), [], metadata=meta, codec="null", sync_marker=sync)
    buf.write(b"".join((avro_long(count), avro_long(len(body)), body, sync)))
    with open(path, "wb") as f:
        f.write(buf.getvalue())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=80), st.binary(max_size=20000)), max_size=30))
def test_computed_places_equal_the_walk(tmp_path_factory, entries):
    """Entries placed from the header's lengths read as the walk reads them, for every varint width."""
    path = written(tmp_path_factory.mktemp("log"), entries)
    computed = read_log(S, path).entries.pairs()
    if entries:
        rewritten(path, None)
    assert computed == read_log(S, path).entries.pairs() == entries


def test_a_file_without_the_lengths_is_walked(tmp_path):
    path = written(tmp_path, block().entries)
    rewritten(path, None)
    with open(path, "rb") as f:
        assert ENTRY_LENGTHS not in fastavro.block_reader(f).metadata
    assert read_log(S, path).entries.pairs() == block().entries


@pytest.mark.parametrize("lengths,damage", [
    ([5, 30] * 99, "lists 99 entries, the block holds 100"),
    ([5, 30] * 99 + [5, 29], "cover 3699 of 3700 body bytes"),
    ([6, 29] + [5, 30] * 99, "prefixes differ"),  # the same total, split elsewhere
])
def test_lengths_that_do_not_fit_the_body_are_named(tmp_path, lengths, damage):
    path = written(tmp_path, block().entries)  # 100 keys of 5 bytes, values of 30
    assert read_log(S, path).entries.pairs() == block().entries
    rewritten(path, lengths)
    with pytest.raises(CorruptFileError, match=damage) as error:
        read_log(S, path)
    assert path in str(error.value)
