"""metatable: keyed tables on a data lake, indexed by a merge-on-read metadata table."""
from .errors import MetatableError
from .metadata_table import MetadataTable
from .spark_pipeline import spark_session
from .table import Table, WriteResult
from .table_config import IndexConfig

__all__ = ["IndexConfig", "MetadataTable", "MetatableError", "Table", "WriteResult", "spark_session"]
