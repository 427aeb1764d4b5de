"""The metadata table: a merge-on-read key-value table of its own (`table.MetadataTable`), its layout of
partitions and file groups (`layout`), one file group merged on read (`file_group`), the record codecs and
merge rules (`records`), and its compaction, clean and undo (`services`).

May import: `file_group`, `formats`, `timeline`, `storage`, the foundation and `indexes`.
"""
