"""Write markers name partitions; the files an instant wrote are found in them by name."""
from __future__ import annotations

import base64
import os

from metatable.file_group.base_file import BaseFile
from metatable.file_group.markers import clear, mark, mark_all, written_by, written_files
from metatable.formats.log_file import LogFile
from metatable.storage.local import LocalStorage
from metatable.storage.paths import TablePaths

INSTANT, OTHER = "20260101000000000", "20260101000000001"


def touch(storage: LocalStorage, paths: TablePaths, partition: str, name: str) -> str:
    storage.write_atomic(paths.file(partition, name), b"x")
    return paths.relative(partition, name)


def test_an_instant_marks_each_partition_once_and_its_files_are_found_by_their_names(tmp_path):
    storage, paths = LocalStorage(), TablePaths(str(tmp_path))
    for partition in ("p=a", "p=b", "p=a", "p=a", "p=b"):
        mark(storage, paths, INSTANT, partition)
    assert len(os.listdir(paths.markers(INSTANT))) == 2
    ours = {
        touch(storage, paths, "p=a", BaseFile("f1", "t1", INSTANT, "parquet").file_name),
        touch(storage, paths, "p=a", LogFile("f2", OTHER, 3, f"{INSTANT}-n1").file_name),
        touch(storage, paths, "p=b", LogFile("f3", INSTANT, 1, f"{INSTANT}-n2").file_name),
    }
    # another instant's files, also one based on this instant, and files that are no data files
    touch(storage, paths, "p=a", BaseFile("f1", "t2", OTHER, "parquet").file_name)
    touch(storage, paths, "p=a", LogFile("f1", INSTANT, 2, f"{OTHER}-n3").file_name)
    touch(storage, paths, "p=a", "notes.txt")
    touch(storage, paths, "p=a", "odd.parquet")
    touch(storage, paths, "p=c", BaseFile("f9", "t3", INSTANT, "parquet").file_name)  # an unmarked partition
    assert written_files(storage, paths, INSTANT) == sorted(ours)
    assert written_files(storage, paths, OTHER) == []


def test_a_marker_that_names_a_file_is_still_read(tmp_path):
    storage, paths = LocalStorage(), TablePaths(str(tmp_path))
    relative = touch(storage, paths, "p=a", BaseFile("f1", "t1", INSTANT, "parquet").file_name)
    storage.write_atomic(os.path.join(paths.markers(INSTANT), base64.urlsafe_b64encode(relative.encode()).decode()),
                         b"")
    assert written_files(storage, paths, INSTANT) == [relative]


def test_a_long_partition_goes_into_the_marker_and_clear_forgets_the_marks(tmp_path):
    storage, paths = LocalStorage(), TablePaths(str(tmp_path))
    partition = f"a={'v' * 100}/b={'w' * 100}"  # 276 bytes in base64
    mark(storage, paths, INSTANT, partition)
    (marker,) = os.listdir(paths.markers(INSTANT))
    assert marker.startswith("~")
    relative = touch(storage, paths, partition, BaseFile("f1", "t1", INSTANT, "parquet").file_name)
    assert written_files(storage, paths, INSTANT) == [relative]
    clear(storage, paths, INSTANT)
    assert not os.path.exists(paths.markers(INSTANT))
    mark(storage, paths, INSTANT, partition)  # forgotten by the clear: marked again
    assert written_files(storage, paths, INSTANT) == [relative]


def test_a_write_that_knows_its_partitions_marks_them_all_in_one_marker(tmp_path):
    """Partitions a path can hold, a line break and `%00` (an escaped NUL) among them; a partition marked
    already is not named again, and a later `mark` of a named one writes nothing."""
    storage, paths = LocalStorage(), TablePaths(str(tmp_path))
    mark(storage, paths, INSTANT, "p=a")
    partitions = ["p=a", "p=b\nc", "p=%00", "p=d"]
    mark_all(storage, paths, INSTANT, partitions)
    mark_all(storage, paths, INSTANT, partitions)
    mark(storage, paths, INSTANT, "p=d")
    assert len(os.listdir(paths.markers(INSTANT))) == 2
    files = sorted(touch(storage, paths, p, BaseFile(f"f{i}", "t", INSTANT, "parquet").file_name)
                   for i, p in enumerate(partitions))
    assert written_files(storage, paths, INSTANT) == files


def test_written_by_reads_the_instant_from_the_name():
    assert written_by(BaseFile("f1", "t1", INSTANT, "parquet").file_name, INSTANT)
    assert written_by(LogFile("f1", OTHER, 1, f"{INSTANT}-n").file_name, INSTANT)
    assert not written_by(LogFile("f1", INSTANT, 1, f"{OTHER}-n").file_name, INSTANT)
    assert not written_by("a_b.parquet", INSTANT)
    assert not written_by(".hidden.parquet", INSTANT)
