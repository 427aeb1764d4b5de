"""Table services, each a `timeline.lifecycle.Service`: compaction, clean, clustering (with the
consistent-hashing resize, `resize`), the async indexer (`indexer`, building through `index_build`), the
metadata rebuild (`rebuild`), `fsck`, and what runs after each commit (`maintenance`).

May import: `write` and every layer below it.
"""
