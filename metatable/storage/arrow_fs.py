"""An object store's storage as a read-only pyarrow file system (`Storage.arrow_filesystem`), so that pyarrow's
datasets read a table's files (a clustering's base files, the Spark data source's staged rows) through the
same requests, retries and credentials as every other read. Writes go through `Storage`, never through this
view."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs

from metatable.errors import InvalidInputError
from metatable.storage.base import Storage


def read_only_filesystem(storage: Storage) -> pafs.FileSystem:
    return pafs.PyFileSystem(ReadOnlyHandler(storage))


class ReadOnlyHandler(pafs.FileSystemHandler):
    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReadOnlyHandler) and other.storage == self.storage

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return "metatable-storage"

    def normalize_path(self, path: str) -> str:
        return path

    def equals(self, other: object) -> bool:
        return self == other

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        out = []
        for path in paths:
            try:
                info = self.storage.stat(path)
                out.append(pafs.FileInfo(path, pafs.FileType.File, mtime=info.modified, size=info.size))
            except FileNotFoundError:
                kind = pafs.FileType.Directory if self.storage.list(path) else pafs.FileType.NotFound
                out.append(pafs.FileInfo(path, kind))
        return out

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return [pafs.FileInfo(f.path, pafs.FileType.File, mtime=f.modified, size=f.size)
                for f in self.storage.walk(selector.base_dir)
                if selector.recursive or os.path.dirname(f.path) == selector.base_dir.rstrip("/")]

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self.storage.open_input(path)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.storage.open_input(path)

    def _read_only(self, *args: object) -> None:
        raise InvalidInputError("a table's storage is read-only through pyarrow: metatable writes through Storage")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = _read_only
    move = copy_file = open_output_stream = open_append_stream = _read_only
