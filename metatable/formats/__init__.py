"""File formats, byte for byte: Avro log files (`log_file`) and the data table's log blocks in them
(`data_log`), SST base files (`sst_file`), Parquet footers and pages read directly (`thrift_compact`,
`key_pages`, `row_pages`), and the clustering plan record (`clustering_plan`).

May import: `timeline` (instant times in file names), `storage`, the foundation and `indexes`.
"""
