"""Keys of a secondary index's entries (`secondary_index_<name>` metadata partitions), vectorized over Arrow.

A **forward** entry maps the indexed values of one record to its record key: its key is the values' tokens,
joined by COLUMN_SEP, then KEY_SEP and the record's `record_index` key. Every value's token starts with a mark
(VALUE_MARK, or NULL_TOKEN for a null), so no token is empty, and a string value has the three separator
characters escaped: the first KEY_SEP of a forward key ends the values. A lookup of values (all of an index's
columns, or a leading prefix of them) is a prefix scan.

A **reverse** entry maps a record key to the tokens of its current values (and its ordering value as text):
its key is KEY_SEP then the `record_index` key, which no forward key starts with. A commit reads the reverse
entries of the keys it writes to find the entries to tombstone, without reading a data file.

A value's text is the column's own text form, except for temporal types (their integer count: a timestamp's
ticks) and booleans ("true"/"false"); a float's negative zero is written as zero, as `==` finds both.
"""
from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

NULL_TOKEN = "!"
VALUE_MARK = "="
COLUMN_SEP = "\x1f"
KEY_SEP = "\x1e"
ESCAPE = "\x1d"
_ESCAPES = ((ESCAPE, ESCAPE + "0"), (KEY_SEP, ESCAPE + "1"), (COLUMN_SEP, ESCAPE + "2"))

def _integer_type(t: pa.DataType) -> pa.DataType | None:
    """The integer type a temporal type's values are counts of (None: not temporal)."""
    if pa.types.is_timestamp(t) or pa.types.is_date64(t) or pa.types.is_time64(t) or pa.types.is_duration(t):
        return pa.int64()
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    return None


def texts(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Each value's text (nulls stay null)."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    t = values.type
    if pa.types.is_dictionary(t):
        values = values.dictionary_decode()
        t = values.type
    integer = _integer_type(t)
    if integer is not None:
        return pc.cast(values.view(integer), pa.string())
    if pa.types.is_boolean(t):
        return pc.if_else(values, "true", "false")
    if pa.types.is_floating(t):
        values = pc.add(values, pa.scalar(0, t))  # -0.0 + 0.0 is 0.0
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return values.cast(pa.string())
    return pc.cast(values, pa.string())


def from_texts(strings: pa.Array, t: pa.DataType) -> pa.Array:
    """`texts` undone: the values of type `t`."""
    integer = _integer_type(t)
    if integer is not None:
        return pc.cast(strings, integer).view(t)
    if pa.types.is_boolean(t):
        return pc.equal(strings, "true")
    return pc.cast(strings, t)


def _numeric_text(t: pa.DataType) -> bool:
    """Whether a column's texts are numbers or words (no separator to escape in them)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or \
        pa.types.is_decimal(t) or pa.types.is_temporal(t)


def tokens(columns: Sequence[pa.Array | pa.ChunkedArray]) -> pa.Array:
    """The token string of each row's values, one column after another."""
    parts: list[Any] = []
    for i, column in enumerate(columns):
        text = texts(column)
        if not _numeric_text(column.type):  # 3 of the 4 calls an integer column's tokens took
            for char, code in _ESCAPES:
                text = pc.replace_substring(text, char, code)
        token = pc.fill_null(pc.binary_join_element_wise(VALUE_MARK, text, ""), NULL_TOKEN)
        parts += [COLUMN_SEP, token] if i else [token]
    if len(parts) == 1:
        return parts[0]
    return pc.binary_join_element_wise(*parts, "")


def value_tokens(values: Sequence[Any], types: Sequence[pa.DataType]) -> list[str]:
    """The token string of one query's values (Python values, None for null), of the given column types."""
    columns = [pa.array([v], t) for v, t in zip(values, types)]
    return tokens(columns).to_pylist()


def forward_keys(token_strings: pa.Array, index_keys: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(token_strings, index_keys, KEY_SEP)


def reverse_keys(index_keys: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(KEY_SEP, index_keys, "")


def scan_prefix(token_string: str, whole: bool) -> str:
    """The prefix of the forward keys of these values: all of the index's columns (`whole`), or a prefix."""
    return token_string + (KEY_SEP if whole else COLUMN_SEP)


def index_key_of(forward_key: str) -> str:
    """The `record_index` key a forward entry's key ends with."""
    return forward_key.split(KEY_SEP, 1)[1]
