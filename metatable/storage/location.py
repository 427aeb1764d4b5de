"""Where a table lives: a local directory or an object-store URL, and the storage that reaches it."""
from __future__ import annotations

import os
from typing import Any, Mapping

from metatable.errors import ConfigError
from metatable.storage.base import Storage
from metatable.storage.local import LocalStorage
from metatable.storage.object_store import ObjectStorage, is_url, split_url


def table_root(path: str) -> str:
    """A table path in one spelling: a local one absolute, a URL as `s3://bucket/key` without a trailing slash."""
    if is_url(path):
        bucket, key = split_url(path)
        return f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
    return os.path.abspath(path)


def storage_for(path: str, storage_options: Mapping[str, Any] | None = None) -> Storage:
    """The storage of a table path: local files, or the bucket of an `s3://` URL with credentials and endpoint
    from the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL`, `AWS_REGION`)
    overlaid with `storage_options`."""
    if is_url(path):
        return ObjectStorage.for_url(path, storage_options)
    if storage_options:
        raise ConfigError(f"storage_options {sorted(storage_options)} are for object stores; {path} is a local path")
    return LocalStorage()
