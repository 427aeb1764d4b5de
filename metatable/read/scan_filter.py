"""Read filters: a conjunction of (column, op, value) and the file skipping it allows.

A file slice is skipped when its base file's column_stats range shows that some
conjunct cannot match any row; slices with log files are never skipped (logs
carry no stats). Rows of the kept slices are then filtered exactly.
"""
from __future__ import annotations

import decimal
import operator
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from indexes.column_stats import stat_value

from metatable.errors import InvalidInputError

Conjunct = tuple[str, str, Any]
_COMPARE = {"==": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater,
            ">=": pc.greater_equal}
OPS = (*_COMPARE, "in")


def validate(filters: Sequence[Conjunct] | None, schema: pa.Schema) -> list[Conjunct]:
    out = []
    for item in filters or []:
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise InvalidInputError(f"a filter is a list of (column, op, value) triples, got {item!r}")
        column, op, value = item
        if column not in schema.names:
            raise InvalidInputError(f"filter column {column!r} is not in the table ({schema.names})")
        if op not in OPS:
            raise InvalidInputError(f"filter op {op!r} is not one of {list(OPS)}")
        out.append((column, op, value))
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


def row_mask(table: pa.Table, filters: Sequence[Conjunct]) -> pa.ChunkedArray | None:
    mask = None
    for column, op, value in filters:
        this = pc.is_in(table[column], value_set=pa.array(list(value), table.schema.field(column).type)) \
            if op == "in" else _COMPARE[op](table[column], pa.scalar(value, table.schema.field(column).type))
        mask = this if mask is None else pc.and_kleene(mask, this)
    return mask


def spark_condition(filters: Sequence[Conjunct]):
    from pyspark.sql import functions as F

    compare = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
               ">=": operator.ge}
    condition = None
    for column, op, value in filters:
        this = F.col(column).isin(list(value)) if op == "in" else compare[op](F.col(column), F.lit(value))
        condition = this if condition is None else condition & this
    return condition
