"""Spark as a plain engine: sessions and schemas (`session`), Python work run as Spark tasks (`tasks`),
snapshots read as DataFrames (`dataframes`), and the project shipped to executors that lack it
(`executors`). The Spark side of a write is `write.spark_write`; `format("metatable")` is the facade's
`spark_source`.

May import: `commit` and every layer below it.
"""
