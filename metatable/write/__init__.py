"""One keyed write: the input checked and conformed (`write_input`), what executors are given
(`write_task`), tagging rows with their file groups (`tagging`), writing one file group (`file_group_writer`,
with `key_prefetch`), the engine in-process (`write_engine`) or on Spark (`spark_write`), and the driver that
runs it and commits (`write_client`).

May import: `read` and every layer below it.
"""
