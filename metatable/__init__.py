"""metatable: keyed tables on a data lake, indexed by a merge-on-read metadata table.

Exports resolve lazily, so that importing a leaf module (`metatable.errors`, which `indexes` uses) does not
pull in the whole engine. docs/architecture.md maps the layers and which way dependencies point.
"""
from importlib import import_module
from typing import Any

_EXPORTS = {
    "IndexConfig": "metatable.table_config",
    "MetadataTable": "metatable.metadata.table",
    "MetatableError": "metatable.errors",
    "StreamSink": "metatable.spark_source",
    "Table": "metatable.table",
    "Txn": "metatable.write.write_client",
    "WriteResult": "metatable.table",
    "register": "metatable.spark_source",
    "spark_session": "metatable.spark_source",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'metatable' has no attribute {name!r}")
