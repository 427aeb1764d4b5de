"""Hypothesis strategies of rows and operations on the model table's schema (`table_model.SCHEMA`). Apart from
the model so that child processes, which import the model's schema, do not import hypothesis (~0.17 s each)."""
from __future__ import annotations

from hypothesis import strategies as st

rows_strategy = st.lists(st.fixed_dictionaries({
    "id": st.integers(0, 15), "p": st.sampled_from(["a", "b", "c"]),
    "v": st.one_of(st.none(), st.text("xyz", max_size=3)), "ts": st.integers(0, 3)}), min_size=1, max_size=12)
operation_strategy = st.tuples(st.sampled_from(["upsert", "upsert", "insert", "delete"]), rows_strategy)
