"""Storage on an S3-compatible object store, through obstore (the Rust `object_store` crate that delta-rs and
hudi-rs use).

Why obstore (measured on a local Ceph RGW, `../shared/research/object-storage.md` section 3): it is the one
non-AWS client with create-if-absent (`PUT If-None-Match: *`), it coalesces ranged reads, it had the lowest
per-request latency (a 4 KiB ranged read 1.41 ms against boto3's 3.22 and pyarrow's 1.83; a 64 KiB PUT 2.8 ms
against 5.1 and 13.0), and it is one small dependency. Only `mode="create"` and plain overwrites are used:
`If-Match` (ETag compare-and-swap) is refused by Ceph RGW 16 and DigitalOcean, which reject the quoted ETag.

Every request is counted by kind (`requests`), so that tests and benchmarks can hold the hot paths to their
request budgets. Requests that can be repeated safely are retried by obstore with backoff (5xx such as
`503 SlowDown`, dropped connections, timeouts). A create-if-absent is retried here instead: when its answer
is lost, a repeat finds the object present, and only reading it back tells whether it is ours.
"""
from __future__ import annotations

import datetime as dt
import io
import itertools
import logging
import os
import random
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import obstore
import pyarrow as pa
import pyarrow.fs as pafs
from obstore.exceptions import AlreadyExistsError, BaseError, PermissionDeniedError, PreconditionError, \
    UnauthenticatedError, UnknownConfigurationKeyError
from obstore.store import S3Store

from metatable.errors import ConfigError, StorageAccessError, StorageError
from metatable.storage.arrow_fs import read_only_filesystem
from metatable.storage.base import TEMP_MARK, FileInfo
from metatable.storage.cache import SizedCache

log = logging.getLogger(__name__)

SCHEMES = ("s3://", "s3a://")
CLOCK = ".clock"  # the object `ages` writes to read the store's clock
TAIL_BYTES = 64 << 10  # what `open_input` reads of a file's end when its size is unknown: Parquet's footer
# Ranges of one read closer than this go in one request: a request's latency buys a few hundred KB on S3
# (~20 ms against ~80 MB/s). At SF 1 on RGW, 64 KiB -> 256 KiB -> 1 MiB: `get` of 1,000 keys 1,533 -> 262 ->
# 224 ranged GETs in 2.85 -> 2.77 -> 3.08 s, a 1,000-row upsert's key probes 283 -> 155 -> 112 in 0.63 ->
# 0.64 -> 0.70 s (object_store.py, one run each).
COALESCE_GAP = 256 << 10
SCRATCH_ENV = "METATABLE_SCRATCH_DIR"
_checked: set[tuple[str | None, str]] = set()  # (endpoint, bucket) that passed `ObjectStorage.check` here
_checked_mutex = threading.Lock()

# storage_options and environment variables, in the spellings delta-rs, pyiceberg and the AWS SDKs use
_ALIASES = {
    "access_key_id": "access_key_id", "aws_access_key_id": "access_key_id", "s3.access-key-id": "access_key_id",
    "secret_access_key": "secret_access_key", "aws_secret_access_key": "secret_access_key",
    "s3.secret-access-key": "secret_access_key",
    "session_token": "session_token", "aws_session_token": "session_token", "s3.session-token": "session_token",
    "token": "session_token",
    "endpoint": "endpoint", "endpoint_url": "endpoint", "aws_endpoint_url": "endpoint", "aws_endpoint": "endpoint",
    "s3.endpoint": "endpoint", "aws_endpoint_url_s3": "endpoint",
    "region": "region", "aws_region": "region", "aws_default_region": "region", "s3.region": "region",
    "allow_http": "allow_http", "aws_allow_http": "allow_http",
    "virtual_hosted_style_request": "virtual_hosted_style_request",
    "aws_virtual_hosted_style_request": "virtual_hosted_style_request",
    "single_writer": "single_writer", "instance_metadata": "instance_metadata",
    "skip_signature": "skip_signature", "aws_skip_signature": "skip_signature",
    "retry_timeout_s": "retry_timeout_s", "metatable_retry_timeout_s": "retry_timeout_s",
}
_ENVIRONMENT = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ALLOW_HTTP",
                "AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "METATABLE_RETRY_TIMEOUT_S")
_CLIENT_KEYS = {"allow_http"}
_OWN_KEYS = {"single_writer", "instance_metadata", "retry_timeout_s"}  # metatable's (`check`, `_connect`)
IMMUTABLE_CACHE_BYTES = 256 << 20  # bytes of files read or written as immutable that a process keeps
RETRY_TIMEOUT_S = 60.0  # how long a request is retried before it is a StorageError (storage option retry_timeout_s)


def is_url(path: str) -> bool:
    """Whether a table path names an object store (`s3://bucket/prefix`) rather than a local directory."""
    return "://" in path


def split_url(path: str) -> tuple[str, str]:
    """(bucket, key) of an `s3://` URL."""
    for scheme in SCHEMES:
        if path.startswith(scheme):
            bucket, _, key = path[len(scheme):].partition("/")
            if not bucket:
                break
            return bucket, key.strip("/")
    raise ConfigError(f"{path!r} is not a table path this version can use: give a local directory or an "
                      "S3-compatible URL s3://bucket/prefix (GCS and Azure are not supported yet)")


def resolved_options(storage_options: Mapping[str, Any] | None) -> dict[str, str]:
    """The environment's AWS settings overlaid with `storage_options`, in one spelling; unknown keys refused."""
    out: dict[str, str] = {}
    for name in _ENVIRONMENT:
        if os.environ.get(name):
            out[_ALIASES[name.lower()]] = os.environ[name]
    for name, value in (storage_options or {}).items():
        key = _ALIASES.get(name.lower())
        if key is None:
            raise ConfigError(f"unknown storage option {name!r}; known: {sorted(set(_ALIASES))}")
        out[key] = str(value)
    if "endpoint" in out and out["endpoint"].startswith("http://") and "allow_http" not in out:
        out["allow_http"] = "true"
    return out


class ObjectFile(io.RawIOBase):
    """A read-only, seekable view of one object, each read one ranged GET (pyarrow's Parquet reader asks for
    the footer, then for the column chunks it needs, coalesced when `pre_buffer` is on)."""

    def __init__(self, storage: ObjectStorage, path: str, size: int | None, tail: bytes = b"") -> None:
        super().__init__()
        self.storage = storage
        self.path = path
        self.tail = tail
        if size is None:  # the footer and the size in one request
            self.tail, size = storage.read_tail(path, TAIL_BYTES)
        self.length = size
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.position = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence] + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def read(self, size: int = -1) -> bytes:
        end = self.length if size is None or size < 0 else min(self.position + size, self.length)
        start, self.position = self.position, max(end, self.position)
        if end <= start:
            return b""
        tail_start = self.length - len(self.tail)
        if self.tail and start >= tail_start:
            return self.tail[start - tail_start:end - tail_start]
        return self.storage.read_range(self.path, start, end - start)

    def readall(self) -> bytes:
        return self.read(-1)


class ObjectStorage:
    """A bucket of an S3-compatible store. Paths are `s3://bucket/key` URLs; a path without a scheme is one of
    this process's local staging files (`staging_path`)."""

    local = False

    def __init__(self, bucket: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.bucket = bucket
        self.options = resolved_options(storage_options)
        self.requests: Counter[str] = Counter()
        self._stores: tuple[S3Store, S3Store] | None = None
        self._mutex = threading.Lock()
        self._immutable: SizedCache[bytes] = SizedCache(IMMUTABLE_CACHE_BYTES)

    @classmethod
    def for_url(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> ObjectStorage:
        return cls(split_url(url)[0], storage_options)

    # pickled into Spark tasks: the settings travel, the connections are made again where it lands
    def __getstate__(self) -> dict[str, Any]:
        return {"bucket": self.bucket, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.bucket, self.options = state["bucket"], state["options"]
        self.requests, self._stores, self._mutex = Counter(), None, threading.Lock()
        self._immutable: SizedCache[bytes] = SizedCache(IMMUTABLE_CACHE_BYTES)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectStorage) and (self.bucket, self.options) == (other.bucket, other.options)

    def __hash__(self) -> int:
        return hash((self.bucket, tuple(sorted(self.options.items()))))

    @property
    def retry_timeout_s(self) -> float:
        return float(self.options.get("retry_timeout_s", RETRY_TIMEOUT_S))

    @property
    def single_writer(self) -> bool:
        """The user said that only one process writes (allowed on a store without create-if-absent)."""
        return _true(self.options.get("single_writer"))

    def check(self, path: str) -> None:
        """Refuse a store that does not honour create-if-absent (`PUT If-None-Match: *`), on which two writers
        could both commit the same instant and one commit be silently lost (the research measured a server that
        acknowledged 100 commits of 4 writers and kept 78), unless storage option `single_writer` says only one
        process writes. Checked once per process and bucket: a create, a second create of the same object that
        must fail, and a suffix read that must return the object's last bytes."""
        with _checked_mutex:
            if (self.options.get("endpoint"), self.bucket) in _checked:
                return
        probe = os.path.join(path, f".capability-{uuid.uuid4().hex}")
        body = b"metatable capability check " + uuid.uuid4().hex.encode()
        try:
            first = self.create_exclusive(probe, body)
        except StorageAccessError:  # read-only credentials: this process commits nothing
            return
        try:
            second = self.create_exclusive(probe, b"a second create")
            kept = self.read(probe)
            tail, size = self.read_tail(probe, 8)
        finally:
            self.delete(probe)
        unsafe_creates = not first or second or kept != body
        if tail != body[-8:] or size != len(body):
            raise StorageError(f"the object store of s3://{self.bucket} answers a suffix range (Range: bytes=-8) "
                               "with the wrong bytes: metatable would misread every Parquet footer there")
        if unsafe_creates and not self.single_writer:
            raise StorageError(f"the object store of s3://{self.bucket} does not honour create-if-absent (PUT "
                               "If-None-Match: *): a second create of an object succeeded, so two writers could both "
                               "commit the same instant and one commit would be lost. Use a store that does (AWS S3, "
                               "Ceph RGW, MinIO), or, where only one process ever writes the table, storage option "
                               "single_writer=true")
        if unsafe_creates:
            log.warning("s3://%s does not honour create-if-absent: allowed with single_writer, one writer only",
                        self.bucket)
        with _checked_mutex:
            _checked.add((self.options.get("endpoint"), self.bucket))

    def _connect(self) -> tuple[S3Store, S3Store]:
        """(the store for every request, the store for create-if-absent, which obstore must not retry)."""
        with self._mutex:
            if self._stores is None:
                keys = {"access_key_id", "secret_access_key"} <= set(self.options)
                if not (keys or _true(self.options.get("instance_metadata")) or
                        _true(self.options.get("skip_signature"))):
                    raise ConfigError(
                        f"no credentials for s3://{self.bucket}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
                        "storage_options access_key_id and secret_access_key); on EC2, storage option "
                        "instance_metadata=true takes them from the instance's role, skip_signature=true reads a "
                        "public bucket")
                config = {k: v for k, v in self.options.items() if k not in _CLIENT_KEYS | _OWN_KEYS}
                client = {"allow_http": _true(self.options.get("allow_http")),
                          "connect_timeout": dt.timedelta(seconds=5), "timeout": dt.timedelta(seconds=60)}
                retry = {"max_retries": 10, "retry_timeout": dt.timedelta(seconds=self.retry_timeout_s),
                         "backoff": {"init_backoff": dt.timedelta(milliseconds=50),
                                     "max_backoff": dt.timedelta(seconds=2), "base": 2}}
                try:
                    self._stores = tuple(S3Store(self.bucket, config=config, client_options=client,
                                                 retry_config=r) for r in (retry, {**retry, "max_retries": 0}))
                except UnknownConfigurationKeyError as e:
                    raise ConfigError(f"storage options for s3://{self.bucket}: {e}") from None
            return self._stores

    def key(self, path: str) -> str:
        bucket, key = split_url(path)
        if bucket != self.bucket:
            raise ConfigError(f"{path} is in bucket {bucket!r}, this table's storage is bucket {self.bucket!r}")
        return key

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _call(self, kind: str, path: str, request: Any, *args: Any, **kwargs: Any) -> Any:
        """One request (retried by obstore where that is safe); what is left after the retries is a
        StorageError naming the path, except a missing object (FileNotFoundError, as on a file system)."""
        self.requests[kind] += 1
        try:
            return request(self._connect()[0], *args, **kwargs)
        except FileNotFoundError:
            raise
        except (PermissionDeniedError, UnauthenticatedError) as e:
            raise StorageAccessError(f"{kind} {path} refused by the store: {first_line(e)}; check the credentials "
                               "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or storage_options) and the bucket's "
                               "policy. Nothing of the operation is visible") from None
        except BaseError as e:
            raise StorageError(f"{kind} {path} failed after retries: {first_line(e)}. Nothing half-written is "
                               "visible; retry the operation once the store answers again") from None

    # -- reading ------------------------------------------------------------------------------------
    def read(self, path: str, immutable: bool = False) -> bytes:
        """`immutable`: the caller knows the file is never rewritten (a data log): its bytes are kept in this
        process, within IMMUTABLE_CACHE_BYTES, and read again from there."""
        if not is_url(path):
            return Path(path).read_bytes()
        if immutable and (data := self._immutable.get(path)) is not None:
            return data
        data = bytes(self._call("GET", path, lambda s: obstore.get(s, self.key(path)).bytes()))
        if immutable:
            self._immutable.put(path, data)
        return data

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        return bytes(self._call("GET_RANGE", path, obstore.get_range, self.key(path), start=offset, length=length))

    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Ranges less than `COALESCE_GAP` apart are read in one request (up to 10 requests at once)."""
        if not ranges:
            return []
        spans = _coalesced(ranges, COALESCE_GAP)
        self.requests["GET_RANGE"] += len(spans)
        try:
            parts = obstore.get_ranges(self._connect()[0], self.key(path), starts=[s for s, _ in spans],
                                       lengths=[n for _, n in spans], coalesce=0)
        except FileNotFoundError:
            raise
        except BaseError as e:
            raise StorageError(f"GET_RANGE {path} failed after retries: {first_line(e)}") from None
        out = []
        for offset, length in ranges:
            for (start, n), part in zip(spans, parts):
                if start <= offset and offset + length <= start + n:
                    out.append(bytes(memoryview(part)[offset - start:offset - start + length]))
                    break
        return out

    def read_tail(self, path: str, length: int) -> tuple[bytes, int]:
        result = self._call("GET_RANGE", path, obstore.get, self.key(path), options={"range": {"suffix": length}})
        return bytes(result.bytes()), result.meta["size"]

    def copy_to_local(self, path: str, local: str) -> None:
        """One GET, streamed to the local file."""
        result = self._call("GET", path, obstore.get, self.key(path))
        try:
            with open(local, "wb") as out:
                for chunk in result.stream(min_chunk_size=8 << 20):
                    out.write(chunk)
        except BaseError as e:
            raise StorageError(f"GET {path} failed while reading: {first_line(e)}") from None

    def open_input(self, path: str, size: int | None = None, tail: bytes = b"") -> pa.NativeFile:
        return pa.PythonFile(ObjectFile(self, path, size, tail), mode="r")

    def arrow_filesystem(self) -> pafs.FileSystem:
        return read_only_filesystem(self)

    def stat(self, path: str) -> FileInfo:
        meta = self._call("HEAD", path, obstore.head, self.key(path))
        return _info(self.url(meta["path"]), meta)

    def content_version(self, path: str) -> str:
        """None needed: metatable writes an object's name once (a rewrite takes a new name)."""
        return ""

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except FileNotFoundError:
            return False

    def size(self, path: str) -> int:
        return self.stat(path).size

    def list(self, path: str) -> list[str]:
        prefix = self.key(path).rstrip("/") + "/"
        listing = self._call("LIST", path, obstore.list_with_delimiter, prefix)
        names = [p["path"][len(prefix):] for p in listing["objects"]]
        names += [p[len(prefix):].rstrip("/") for p in listing["common_prefixes"]]
        return sorted(n for n in names if n)

    def sizes(self, path: str) -> dict[str, int]:
        prefix = self.key(path).rstrip("/") + "/"
        listing = self._call("LIST", path, obstore.list_with_delimiter, prefix)
        return {m["path"][len(prefix):]: m["size"] for m in listing["objects"]}

    def walk(self, path: str) -> Iterator[FileInfo]:
        prefix = self.key(path).rstrip("/") + "/"
        pages = 0  # a request per page of 1,000 (S3's most), one for an empty listing
        try:
            for chunk in obstore.list(self._connect()[0], prefix, chunk_size=1000):
                pages += 1
                for meta in chunk:
                    yield _info(self.url(meta["path"]), meta)
        except BaseError as e:
            raise StorageError(f"LIST {path} failed after retries: {first_line(e)}") from None
        finally:
            self.requests["LIST"] += max(pages, 1)

    def clock(self, path: str) -> float:
        """The store's now, to the second: the modification time of an object written under `path` for it."""
        clock = f"{self.key(path).rstrip('/')}/{CLOCK}"
        self._call("PUT", path, obstore.put, clock, b"")
        return self._call("HEAD", path, obstore.head, clock)["last_modified"].timestamp()

    def ages(self, path: str) -> dict[str, float]:
        """One PUT and one LIST: the clock object's modification time is the store's now, and a listing
        carries every object's, to the millisecond (a HEAD's `Last-Modified` has only seconds)."""
        directory = self.key(path).rstrip("/")
        self._call("PUT", path, obstore.put, f"{directory}/{CLOCK}", b"")
        listing = self._call("LIST", path, obstore.list_with_delimiter, directory + "/")
        times = {m["path"].rsplit("/", 1)[1]: m["last_modified"].timestamp() for m in listing["objects"]}
        now = times.pop(CLOCK, None)
        if now is None:
            raise StorageError(f"the store did not list {path}/{CLOCK} right after writing it: it does not list "
                               "what was written (metatable needs read-after-write listings)")
        return {name: max(now - modified, 0.0) for name, modified in times.items()}

    # -- writing ------------------------------------------------------------------------------------
    def write_atomic(self, path: str, data: bytes, immutable: bool = False, durable: bool = True) -> None:
        self._call("PUT", path, obstore.put, self.key(path), data, use_multipart=False)
        if immutable:  # a writer reads what it wrote (the next write into a file group reads its logs)
            self._immutable.put(path, data)

    def sync(self, path: str) -> None:
        """Nothing: a PUT is durable when it returns."""

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Retried here, not by obstore, for `retry_timeout_s`: a repeat of a create whose answer was lost finds
        the object present, and reading it back tells whether it holds these bytes (callers that race make
        their contents unique: the lock's generations carry a nonce)."""
        key = self.key(path)
        store = self._connect()[1]
        deadline = time.monotonic() + self.retry_timeout_s
        for attempt in itertools.count():
            self.requests["PUT"] += 1
            try:
                obstore.put(store, key, data, mode="create")
                return True
            except (AlreadyExistsError, PreconditionError):
                if attempt == 0:
                    return False
                try:  # an earlier attempt whose answer was lost may have created it: then it holds our bytes
                    return self.read(path) == data
                except FileNotFoundError:
                    return False
            except (PermissionDeniedError, UnauthenticatedError) as e:
                raise StorageAccessError(f"PUT {path} refused by the store: {first_line(e)}; check the "
                                         "credentials") from None
            except BaseError as e:  # 503 SlowDown, 409 ConditionalRequestConflict, a dropped connection
                if time.monotonic() > deadline:
                    raise StorageError(f"PUT {path} (create if absent) failed after {attempt + 1} attempts in "
                                       f"{self.retry_timeout_s:.0f}s: {first_line(e)}. Nothing half-written is "
                                       "visible; retry the operation once the store answers again") from None
                time.sleep(min(2.0, 0.05 * 2 ** attempt) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def staging_path(self, path: str) -> str:
        local = self.scratch(os.path.dirname(path))
        os.makedirs(local, exist_ok=True)
        return os.path.join(local, f".{os.path.basename(path)}{TEMP_MARK}{uuid.uuid4().hex[:12]}")

    def publish(self, staged: str, path: str) -> int:
        size = os.path.getsize(staged)
        self._call("PUT", path, obstore.put, self.key(path), Path(staged), use_multipart=size > (32 << 20))
        os.unlink(staged)
        return size

    def move(self, source: str, target: str) -> None:
        self._call("COPY", source, obstore.copy, self.key(source), self.key(target))
        self.delete(source)

    def delete(self, path: str) -> None:
        if not is_url(path):  # a local staging file
            Path(path).unlink(missing_ok=True)
            return
        self._deleted(path, self.key(path))

    def delete_many(self, paths: Sequence[str]) -> None:
        """One request per 1,000 objects (S3's DeleteObjects)."""
        keys = [self.key(p) for p in paths]
        for start in range(0, len(keys), 1000):
            self._deleted(paths[start], keys[start:start + 1000])

    def _deleted(self, path: str, keys: str | list[str]) -> None:
        """obstore deletes through DeleteObjects, which reports a failure per key and is not retried; RGW fails
        the delete of an object another request is writing at that moment (measured: 81 of 300 deletes of an
        object a thread kept rewriting, as a heartbeat is). Deletes are idempotent: retried here."""
        deadline = time.monotonic() + self.retry_timeout_s
        for attempt in itertools.count():
            try:
                self._call("DELETE", path, obstore.delete, keys)
                return
            except StorageAccessError:
                raise
            except StorageError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(min(2.0, 0.02 * 2 ** attempt) * random.uniform(0.5, 1.0))

    def remove_dir(self, path: str) -> None:
        self.delete_many([f.path for f in self.walk(path)])

    def makedirs(self, path: str) -> None:
        """Object stores have no directories."""

    def scratch(self, path: str) -> str:
        root = os.environ.get(SCRATCH_ENV) or os.path.join(tempfile.gettempdir(), f"metatable-{os.getuid()}")
        return os.path.join(root, "s3", self.bucket, self.key(path))


def _true(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


def _coalesced(ranges: Sequence[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    spans: list[list[int]] = []
    for offset, length in sorted(ranges):
        if spans and offset <= spans[-1][1] + gap:
            spans[-1][1] = max(spans[-1][1], offset + length)
        else:
            spans.append([offset, offset + length])
    return [(start, end - start) for start, end in spans]


def _info(url: str, meta: Mapping[str, Any]) -> FileInfo:
    return FileInfo(url, meta["size"], meta["last_modified"].timestamp(), meta.get("e_tag") or "")


def first_line(error: Exception) -> str:
    return str(error).split("\n", 1)[0][:500]
