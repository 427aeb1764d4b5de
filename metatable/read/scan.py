"""`Table.scan`: a snapshot read described, not yet done, for other engines to run lazily.

The snapshot and the file slices it needs are fixed when the scan is made (column stats have skipped what the
filter rules out); rows are read one file slice at a time, as the consumer asks. DuckDB and pyarrow take the
scan through the Arrow C stream interface (`__arrow_c_stream__`); Polars as a LazyFrame (`to_polars`) whose
projection, predicate and row limit reach the read: only the columns the query uses are read from disk, and
reading stops once the limit is met. A Polars predicate is applied to each slice's rows as they are read; to
skip file slices by column stats, give the scan a `filter` too.
"""
from __future__ import annotations

import logging
from typing import Any, Iterator, Sequence

import pyarrow as pa

from metatable.commit.context import TableContext
from metatable.read.reads import ScanPlan, slice_tables

log = logging.getLogger(__name__)


class Scan:
    def __init__(self, context: TableContext, plan: ScanPlan, columns: Sequence[str] | None = None,
                 read_optimized: bool = False) -> None:
        self.context = context
        self.plan = plan
        self.schema, _ = plan.projected(columns)  # checks the columns now, before anything is read
        self.read_optimized = read_optimized

    def tables(self, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
        """The rows, one file slice at a time, in `columns` (a subset of the scan's; all of them by default)."""
        names = list(columns) if columns is not None else self.schema.names
        log.debug("scan of %s: reading columns %s of %d file slices", self.context.root, names, len(self.plan.slices))
        with self.context.snapshot_kept(self.plan.snapshot):  # a scan read slowly may be overtaken by a clean
            yield from slice_tables(self.context, self.plan, names, self.read_optimized)

    def to_batches(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.schema, (b for t in self.tables() for b in t.to_batches()))

    def to_arrow(self) -> pa.Table:
        return pa.Table.from_batches(list(self.to_batches()), self.schema)

    def to_pandas(self) -> Any:
        """The scan's rows as a pandas DataFrame (pandas must be installed)."""
        return self.to_arrow().to_pandas()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.to_batches().__arrow_c_stream__(requested_schema)

    def to_polars(self) -> Any:
        """A Polars LazyFrame over the scan (polars must be installed)."""
        import polars as pl  # an optional dependency: only this method needs it
        from polars.io.plugins import register_io_source

        def source(with_columns: list[str] | None, predicate: Any, n_rows: int | None,
                   batch_size: int | None) -> Iterator[pl.DataFrame]:
            wanted = with_columns if with_columns is not None else self.schema.names
            used = set(predicate.meta.root_names()) if predicate is not None else set()
            read = [c for c in self.schema.names if c in wanted or c in used]
            left = n_rows
            for table in self.tables(read):
                frame = pl.from_arrow(table)
                if predicate is not None:
                    frame = frame.filter(predicate)
                frame = frame.select(wanted)
                if left is not None:
                    frame = frame.head(left)
                    left -= frame.height
                yield frame
                if left is not None and left <= 0:
                    return
        return register_io_source(source, schema=pl.from_arrow(self.schema.empty_table()).schema)
