"""Pinned vectors for the contract hash and key definitions (computed with mmh3/base64 directly)."""
import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from indexes import keys
from indexes.arrow_keys import record_index_key_arrays

from metatable.errors import InvalidInputError

VECTORS = [
    ("", 0, "0000000000000000", "00000000000000000000000000000000"),
    ("a", 1009084850, "85555565f6597889", "897859f6655555855a890e51483ab5e6"),
    ("hello", 613153351, "cbd8a7b341bd9b02", "029bbd41b3a7d8cb191dae486a901e5b"),
    ("key-001", 582274448, "1cb4fbd13b368fb9", "b98f363bd1fbb41c6b0ebcfe3b8909a3"),
    ("ünïcode", 799967836, "dd59d9d958dac980", "80c9da58d9d959ddb1f38106da4eb349"),
    ("2024", 591942686, "d61b48e3912d07bb", "bb072d91e3481bd6d8bf3c316303f06a"),
]


@pytest.mark.parametrize("text,h32,h64,h128", VECTORS)
def test_hash_vectors(text, h32, h64, h128):
    assert keys.hash32(text) == h32
    assert keys.hash64(text).hex() == h64
    assert keys.hash128(text).hex() == h128
    assert keys.hash32(text.encode()) == h32


def test_metadata_keys():
    assert keys.files_key("2024") == "2024"
    assert keys.files_key("") == "."
    assert keys.bloom_filter_key("2024", "f1.parquet") == "1htI45EtB7s=EhIgjnzoBy+UT70CEVgiLA=="
    assert keys.column_stats_key("l_orderkey", "2024", "f1.parquet") == \
        "cz/LEm8qXWc=1htI45EtB7s=EhIgjnzoBy+UT70CEVgiLA=="
    assert keys.hashing_meta_key("2024") == "2024"
    # fixed-length components make prefixes range-scannable
    assert keys.column_stats_key("l_orderkey", "2024", "other").startswith(keys.column_stats_prefix("l_orderkey", "2024"))
    assert keys.bloom_filter_key("2024", "x").startswith(keys.bloom_filter_prefix("2024"))
    assert len(keys.column_stats_prefix("c")) == 12


def test_record_key():
    assert keys.record_key(["id"], [42]) == "42"
    assert keys.record_key(["a", "b"], [1, "x"]) == "a:1,b:x"
    assert keys.record_key(["d"], [dt.date(2024, 3, 1)]) == "2024-03-01"
    with pytest.raises(InvalidInputError, match="'b' is null"):
        keys.record_key(["a", "b"], [1, None])
    with pytest.raises(InvalidInputError, match="empty"):
        keys.record_key(["a"], [""])


def test_record_index_key_vectors():
    assert keys.record_index_key("p=a", "id:1", True) == "id:1"
    prefix = keys.b64(keys.hash64("p=a"))
    assert keys.record_index_key("p=a", "7", False) == prefix + "7"
    assert len(prefix) == 12  # a fixed-length prefix: every key of a partition range-scans together
    two = pa.array(["1", "2", "3"])
    assert record_index_key_arrays(pa.array(["p=a", "p=b", "p=a"]), two, False).to_pylist() == [
        prefix + "1", keys.b64(keys.hash64("p=b")) + "2", prefix + "3"]
    encoded = pc.dictionary_encode(pa.array(["p=b", "p=a", "p=b"]))
    assert record_index_key_arrays(encoded, two, False).to_pylist() == [
        keys.record_index_key(p, k, False) for p, k in zip(["p=b", "p=a", "p=b"], ["1", "2", "3"])]
    assert record_index_key_arrays(None, two, True).to_pylist() == ["1", "2", "3"]
