"""Read filters: (column, op, value) conjuncts, ANDed, or a list of such conjunctions, ORed (pyarrow's
disjunctive normal form), and the file skipping they allow.

A file slice is skipped when every conjunction has a conjunct that cannot match any of its rows: by its
partition's values (read off its path, whatever its files: logs included), or by its base file's column_stats
ranges (a slice with logs only by its partition: logs carry no stats). Rows of the kept slices are then
filtered exactly. Values are coerced to their column's type first, as
pyarrow casts them (a date given as "1995-03-01", a decimal column compared with an int): a value that
does not convert is an error naming the column.
"""
from __future__ import annotations

import decimal
import operator
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from indexes.arrow_keys import partition_texts
from indexes.column_stats import stat_value

from metatable.errors import InvalidInputError

Conjunct = tuple[str, str, Any]
_COMPARE = {"==": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater,
            ">=": pc.greater_equal}
OPS = (*_COMPARE, "in")


Filter = list[list[Conjunct]]  # ORed conjunctions of ANDed conjuncts


def filter_columns(filters: Filter) -> set[str]:
    """The columns a filter reads."""
    return {column for conjunction in filters for column, _, _ in conjunction}


def parse_filter(filters: Sequence[Conjunct] | Sequence[Sequence[Conjunct]] | None, schema: pa.Schema) -> Filter:
    """The filter as ORed conjunctions, each value of its column's type; [] for none."""
    if not filters:
        return []
    if not isinstance(filters, (list, tuple)):
        raise InvalidInputError(f"a filter is a list of (column, op, value) triples, or a list of such lists (ORed); "
                                f"got {filters!r}")
    nested = all(isinstance(item, (list, tuple)) and item and all(isinstance(c, (list, tuple)) for c in item)
                 for item in filters)
    return [[_conjunct(c, schema) for c in conjunction] for conjunction in (filters if nested else [filters])]


def _conjunct(item: Any, schema: pa.Schema) -> Conjunct:
    if not isinstance(item, (tuple, list)) or len(item) != 3:
        raise InvalidInputError(f"a filter is a list of (column, op, value) triples, got {item!r}")
    column, op, value = item
    if column not in schema.names:
        raise InvalidInputError(f"filter column {column!r} is not in the table ({schema.names})")
    if op not in OPS:
        raise InvalidInputError(f"filter op {op!r} is not one of {list(OPS)}")
    type_ = schema.field(column).type
    if pa.types.is_nested(type_):
        raise InvalidInputError(f"filter column {column!r} is a {type_}: filters compare plain columns")
    if op == "in":
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise InvalidInputError(f"filter ({column!r}, 'in', ...) takes a list of values, got {value!r}")
        return column, op, [coerced(column, type_, v) for v in value]
    return column, op, coerced(column, type_, value)


def coerced(column: str, type_: pa.DataType, value: Any) -> Any:
    """`value` as a Python value of the column's type (as pyarrow converts it), or an error naming the column."""
    if value is None:
        raise InvalidInputError(f"{column!r} is compared with or set to None here; a filter never matches null, "
                                "and an update sets values")
    try:
        return pa.scalar(value, type_).as_py()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError, OverflowError):
        pass
    try:
        return pc.cast(pa.scalar(value), type_, safe=True).as_py()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as e:
        raise InvalidInputError(f"value {value!r} for column {column!r} does not convert to its type "
                                f"{type_}: {e}") from None


NULLS = ("nulls only",)  # what `stats(column)` gives for a column holding only nulls: no conjunct matches null


def may_match_any(filters: Filter, stats: Any) -> bool:
    """Could some row match: does some conjunction have every conjunct possible in the ranges `stats(column)`
    gives ((min, max); None when unknown; NULLS when the column holds only nulls)?"""
    for conjunction in filters:
        if all((r := stats(column)) is None or (r is not NULLS and may_match(op, value, *r))
               for column, op, value in conjunction):
            return True
    return not filters


_EXACT_PARTITION_TEXT = (pa.types.is_string, pa.types.is_integer, pa.types.is_boolean, pa.types.is_date32)


def partition_ranges(partition: str, schema: pa.Schema, partition_by: Sequence[str]) -> dict[str, Any]:
    """The range of each partition column in a partition (one value, or NULLS), read off its path: what lets a
    read skip a file slice whatever its files, logs included. Only for types whose path text is exact (a
    timestamp's text drops its fraction)."""
    texts = partition_texts(partition, partition_by)
    out: dict[str, Any] = {}
    for name, text in (texts or {}).items():
        type_ = schema.field(name).type
        if text is None:
            out[name] = NULLS
        elif any(is_type(type_) for is_type in _EXACT_PARTITION_TEXT):
            try:
                value = text == "true" if pa.types.is_boolean(type_) else pa.scalar(text).cast(type_).as_py()
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                continue
            out[name] = (value, value)
    return out


def _comparable(v: Any) -> Any:
    return float(v) if isinstance(v, decimal.Decimal) else v


def may_match(op: str, value: Any, lo: Any, hi: Any) -> bool:
    """Could some value in [lo, hi] satisfy `v op value`? (No range: yes.)"""
    if lo is None or hi is None:
        return True
    lo, hi = stat_value(lo), stat_value(hi)
    try:
        if op == "in":
            return any(lo <= _comparable(v) <= hi for v in value)
        value = _comparable(value)
        return {"==": lambda: lo <= value <= hi, "!=": lambda: not (lo == hi == value),
                "<": lambda: lo < value, "<=": lambda: lo <= value,
                ">": lambda: hi > value, ">=": lambda: hi >= value}[op]()
    except TypeError:  # incomparable types: never skip on a guess
        return True


def row_mask(table: pa.Table, filters: Filter) -> pa.ChunkedArray | None:
    """Which rows match: some conjunction all of whose conjuncts hold (a null compares false)."""
    mask = None
    for conjunction in filters:
        this = None
        for column, op, value in conjunction:
            type_ = table.schema.field(column).type
            one = pc.is_in(table[column], value_set=pa.array(list(value), type_)) if op == "in" \
                else _COMPARE[op](table[column], pa.scalar(value, type_))
            this = one if this is None else pc.and_kleene(this, one)
        mask = this if mask is None else pc.or_kleene(mask, this)
    return pc.fill_null(mask, False) if mask is not None else None


def spark_condition(filters: Filter):
    from pyspark.sql import functions as F

    compare = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
               ">=": operator.ge}
    condition = None
    for conjunction in filters:
        this = None
        for column, op, value in conjunction:
            one = F.col(column).isin(list(value)) if op == "in" else compare[op](F.col(column), F.lit(value))
            this = one if this is None else this & one
        condition = this if condition is None else condition | this
    return condition
