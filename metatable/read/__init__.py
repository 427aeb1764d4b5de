"""Reads: scan plans with partition and column-stats skipping (`reads`, `scan_filter`), finding keys among
file slices or in the metadata indexes (`locator`), `Table.lookup` / `Table.get` (`key_lookup`), and
`Table.changes` (`changes`).

May import: `spark` and every layer below it.
"""
