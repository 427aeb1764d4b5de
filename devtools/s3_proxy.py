"""An HTTP proxy in front of a local S3 server that counts requests by kind and injects faults, for the
object-store tests and benchmark. It runs an asyncio server on 127.0.0.1 in a thread of the process that
starts it; clients (this process's and its children's) reach it as their endpoint.

Kinds: GET, GET_RANGE (a `Range` header), HEAD, PUT, LIST (`list-type` query), DELETE (single, or a bulk
`POST ?delete`), COPY (a PUT with `x-amz-copy-source`), MULTIPART (the other POSTs and the PUTs of parts).

Faults, each a probability per request, set on the running proxy:
- `slow_down`: answer `503 SlowDown` without forwarding (S3's throttling);
- `drop_before`: close the connection without forwarding the request;
- `drop_after`: forward the request, then close the connection without its answer (the request took effect,
  the client cannot know: the case a create-if-absent must survive);
- `ignore_conditions`: answer a conditional write that the server refused (412) with 200, as a store that
  ignores `If-None-Match` acknowledges every create (the headers themselves are signed: they cannot be
  removed on the way).
"""
from __future__ import annotations

import asyncio
import random
import threading
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field

HOST = "127.0.0.1"
SLOW_DOWN = (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n"
             b"Connection: keep-alive\r\n\r\n%s")
SLOW_DOWN_BODY = (b"<?xml version=\"1.0\"?><Error><Code>SlowDown</Code><Message>Reduce your request rate."
                  b"</Message></Error>")


@dataclass
class Faults:
    slow_down: float = 0.0
    drop_before: float = 0.0
    drop_after: float = 0.0
    ignore_conditions: bool = False
    only_methods: tuple[str, ...] = ()  # faults only for these methods (all when empty)


@dataclass
class S3Proxy:
    upstream: str  # http://host:port
    faults: Faults = field(default_factory=Faults)
    requests: Counter = field(default_factory=Counter)
    injected: Counter = field(default_factory=Counter)
    seed: int = 0
    port: int = 0
    trace: list[tuple[str, str]] | None = None  # when a list: every request's kind and target, in order

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlparse(self.upstream)
        self._upstream = (parsed.hostname, parsed.port)
        self._random = random.Random(self.seed)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> S3Proxy:
        ready = threading.Event()

        def run() -> None:
            self._loop = loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            server = loop.run_until_complete(asyncio.start_server(self._serve, HOST, 0))
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            server.close()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="s3-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.requests)

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            if self.trace is not None:
                self.trace.clear()

    def _roll(self, p: float) -> bool:
        with self._lock:
            return p > 0 and self._random.random() < p

    # -- serving -------------------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                head = await _read_head(reader)
                if head is None:
                    return
                request_line, headers = head
                body = await _read_body(reader, headers)
                method, target = request_line.split(" ")[:2]
                kind = _kind(method, target, headers)
                with self._lock:
                    self.requests[kind] += 1
                    if self.trace is not None:
                        self.trace.append((kind, urllib.parse.unquote(target)))
                faults = self.faults
                faulty = not faults.only_methods or method in faults.only_methods
                if faulty and self._roll(faults.slow_down):
                    self.injected["slow_down"] += 1
                    writer.write(SLOW_DOWN % (len(SLOW_DOWN_BODY), SLOW_DOWN_BODY))
                    await writer.drain()
                    continue
                if faulty and self._roll(faults.drop_before):
                    self.injected["drop_before"] += 1
                    return
                if upstream is None:
                    upstream = await asyncio.open_connection(*self._upstream)
                up_reader, up_writer = upstream
                up_writer.write(_encode(request_line, headers, body))
                await up_writer.drain()
                response = await _read_head(up_reader)
                if response is None:
                    return
                status_line, response_headers = response
                no_body = method == "HEAD" or status_line.split(" ")[1] in ("204", "304")
                response_body = b"" if no_body else await _read_body(up_reader, response_headers)
                if faults.ignore_conditions and method == "PUT" and status_line.split(" ")[1] == "412":
                    self.injected["ignored_condition"] += 1
                    status_line, response_headers, response_body = "HTTP/1.1 200 OK", [
                        ("Content-Length", "0"), ("ETag", '"00000000000000000000000000000000"')], b""
                if faulty and self._roll(faults.drop_after):
                    self.injected["drop_after"] += 1
                    return
                writer.write(_encode(status_line, response_headers, response_body))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return
        finally:
            writer.close()
            if upstream is not None:
                upstream[1].close()


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, list[tuple[str, str]]] | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = raw.decode("latin-1").split("\r\n")
    headers = [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:] if line]
    return lines[0], headers  # type: ignore[return-value]


async def _read_body(reader: asyncio.StreamReader, headers: list[tuple[str, str]]) -> bytes:
    values = {k.lower(): v for k, v in headers}
    if "content-length" in values:
        return await reader.readexactly(int(values["content-length"]))
    if values.get("transfer-encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            out += size_line
            size = int(size_line.split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            out += chunk
            if size == 0:
                return bytes(out)
    return b""


def _encode(first_line: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    return (first_line + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode("latin-1") + body


def _kind(method: str, target: str, headers: list[tuple[str, str]]) -> str:
    query = urllib.parse.urlparse(target).query
    names = {k.lower() for k, _ in headers}
    params = urllib.parse.parse_qs(query, keep_blank_values=True)
    if method == "GET":
        if "list-type" in params or (target.count("/") <= 2 and "uploads" not in params and "?" in target):
            return "LIST"
        return "GET_RANGE" if "range" in names else "GET"
    if method == "PUT":
        if "partNumber" in params:
            return "MULTIPART"
        return "COPY" if "x-amz-copy-source" in names else "PUT"
    if method == "POST":
        return "DELETE" if "delete" in params else "MULTIPART"
    return method
