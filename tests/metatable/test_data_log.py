import datetime as dt
import decimal
import shutil
import tempfile

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

import metatable as mt
from metatable.errors import CorruptFileError
from metatable.formats.data_log import CODEC_KEY, WHOLE_BLOCK_BYTES, read_data_log, write_data_log
from metatable.formats.log_file import read_container
from metatable.storage.local import LocalStorage

from .strategies import operation_strategy
from .table_model import SCHEMA as TABLE_SCHEMA, TableModel, sort_rows

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


def data_block_start(container: bytes) -> int:
    """Where an Avro container's first data block begins: after the header, which ends with the sync marker
    that also ends the file."""
    return container.index(container[-16:]) + 16


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_damaged_arrow_block_is_named(tmp_path, codec):
    """A flipped byte inside an Arrow block's data fails its CRC-32, where an uncompressed buffer would
    otherwise read as another value."""
    path = str(tmp_path / "log")
    write_data_log(LocalStorage(), path, "20240101000000000", ROWS, "arrow", codec)
    data = bytearray(open(path, "rb").read())
    at = data_block_start(data) + 60  # inside the block (an IPC file, or one compressed whole)
    data[at] ^= 0x01
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptFileError, match="CRC-32"):
        read_data_log(LocalStorage(), path, SCHEMA)


@settings(max_examples=20, deadline=None)
@given(ops=st.lists(operation_strategy, min_size=1, max_size=6),
       formats=st.lists(st.sampled_from(["arrow", "parquet", "avro"]), min_size=6, max_size=6))
def test_slices_mixing_block_formats_read_as_the_model(ops, formats):
    """Each write of a merge-on-read table uses another block format (an older table keeps its Parquet
    blocks when the default changes): reads, `get` and a compaction see what a plain model says."""
    root = tempfile.mkdtemp(prefix="mt-blocks-")
    try:
        mt.Table.create(f"{root}/t", TABLE_SCHEMA, "id", "p", "ts", index=mt.IndexConfig(num_buckets=2))
        model = TableModel(partitioned=True)
        for (operation, rows), block_format in zip(ops, formats):
            table = mt.Table.open(f"{root}/t", options={"write.log.block_format": block_format})
            data = pa.Table.from_pylist(rows, schema=TABLE_SCHEMA)
            getattr(table, operation)(data.select(["id", "p"]) if operation == "delete" else data)
            model.apply(operation, rows)
        expected = model.expected()
        assert sort_rows(table.to_arrow().to_pylist()) == expected
        asked = pa.Table.from_pylist(expected, schema=TABLE_SCHEMA).select(["id", "p"])
        assert sort_rows(table.get(asked).to_pylist()) == expected
        table.compact()
        assert sort_rows(mt.Table.open(f"{root}/t").to_arrow().to_pylist()) == expected
    finally:
        shutil.rmtree(root, ignore_errors=True)


MANY = pa.Table.from_pylist([{"i": i, "s": f"s{i % 13}", "d": dt.date(2020, 1, 1 + i % 28),
                              "m": decimal.Decimal(i) / 4, "t": dt.datetime(2020, 1, 2, i % 24), "b": i % 2 == 0,
                              "_mt_record_key": str(i), "_mt_is_deleted": i % 7 == 0} for i in range(300)],
                            schema=SCHEMA)


@pytest.mark.parametrize("codec", ["zstd", "none"])
@settings(max_examples=100, deadline=None)
@given(position=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_a_flipped_bit_anywhere_in_an_arrow_block_never_reads_wrong_rows(tmp_path_factory, codec, position, bit):
    """Header, Avro framing or IPC bytes: the read gives the rows written or a CorruptFileError naming the file."""
    path = str(tmp_path_factory.mktemp("flip") / "log")
    write_data_log(LocalStorage(), path, "20240101000000000", MANY, "arrow", codec)
    data = bytearray(open(path, "rb").read())
    data[int(position * len(data))] ^= 1 << bit
    open(path, "wb").write(bytes(data))
    try:
        assert read_data_log(LocalStorage(), path, SCHEMA)[1].equals(MANY)
    except CorruptFileError as e:
        assert e.path == path


def test_every_byte_of_an_arrow_blocks_header_flipped_never_reads_wrong_rows(tmp_path):
    """The Avro header (schema, metadata, sync marker) has no checksum of its own; each byte flipped in turn
    (a flipped metadata key once escaped as a KeyError)."""
    path = str(tmp_path / "log")
    write_data_log(LocalStorage(), path, "20240101000000000", MANY, "arrow", "zstd")
    original = open(path, "rb").read()
    for position in range(data_block_start(original)):
        data = bytearray(original)
        data[position] ^= 1 << (position % 8)
        open(path, "wb").write(bytes(data))
        try:
            assert read_data_log(LocalStorage(), path, SCHEMA)[1].equals(MANY), position
        except CorruptFileError as e:
            assert e.path == path


def test_small_blocks_are_compressed_whole_and_large_ones_buffer_by_buffer(tmp_path):
    """A small block is one codec call (faster and smaller for the few rows of a file group's share); a large
    one keeps Arrow's buffer-by-buffer compression, so that a read decodes only the columns it asks for.
    Both read back as written."""
    large = pa.concat_tables([MANY] * (WHOLE_BLOCK_BYTES // MANY.nbytes + 1))
    assert MANY.nbytes < WHOLE_BLOCK_BYTES <= large.nbytes
    for name, rows in [("small", MANY), ("large", large)]:
        path = str(tmp_path / name)
        write_data_log(LocalStorage(), path, "20240101000000000", rows, "arrow", "zstd")
        meta, _ = read_container(LocalStorage(), path)
        assert (meta.get(CODEC_KEY) == "zstd") == (name == "small")
        assert read_data_log(LocalStorage(), path, SCHEMA)[1].equals(rows)
        wanted = pa.schema([SCHEMA.field("s")])
        assert read_data_log(LocalStorage(), path, wanted)[1].equals(rows.select(["s"]))
