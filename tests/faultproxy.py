"""A fault-injecting HTTP proxy for S3 (moto) on 127.0.0.1, in the spirit of
mountpoint-s3's failure-injecting client and gcsfuse's emulator proxy.

It forwards each HTTP/1.1 request to the upstream S3 server and, when a rule
matches, injects a fault instead of (or into) the real answer:

==========  =====================================================================
kind        what the client sees
==========  =====================================================================
``503``     503 SlowDown with S3's XML body
``500``     500 InternalError with S3's XML body
``429``     429 TooManyRequests
``reset``   the connection is reset (RST) before any response byte
``truncate`` the real status and headers (full Content-Length), then half the body,
            then the connection closes
``stall``   nothing for ``stall`` seconds, then the connection closes
``late``    nothing for ``stall`` seconds, then the real response (a slow server)
``403``     403 AccessDenied
``expired`` 403 ExpiredToken
``404``     404 NoSuchKey (also for keys that exist)
``flip``    the real response with one body byte flipped, when S3 sent a checksum
            header for it (a range has none: then it passes unchanged)
``silent``  the connection stays open and nothing is answered, until the rules are set
            again: it is then reset, and the client's next try meets the new rules (a test
            that clears a hang does not wait out the client's timeout)
``whole``   a ranged GET answered 200 with the whole object (the Range header is dropped
            on the way up: a server or proxy may ignore Range, RFC 9110 allows it)
``short``   a ranged GET answered 206 with the first half of the range asked, its
            Content-Range saying so (the object goes on past it)
``endless`` 200 with a Content-Length of 2**40, and a body of zeros that never ends
``trickle`` the real response, its body sent one byte every 0.25 s
``drip``    the real response, its status line and headers too, one byte every 0.25 s
            (a PUT's or a listing's answer never ends inside botocore's timeout)
``unconditional`` a request carrying If-None-Match answered 501 NotImplemented (a server
            without conditional writes); one without it passes unchanged
``ignore-condition`` a request's If-None-Match dropped on the way up (a server that
            ignores it)
``lost``    the request is served upstream, then the connection is reset before any
            byte of the answer (the work was done; the client cannot know)
``nosuchupload`` 404 NoSuchUpload (what MinIO answers a CompleteMultipartUpload of an
            upload it completed already)
==========  =====================================================================

A rule targets operations (``get``: GetObject, ``head``: HeadObject, ``list``:
ListObjectsV2/ListObjects, ``put``, ``other``), and fires at a ``rate``
(probability), for the first ``count`` matches, and/or within a ``window`` of
seconds after the rules were set. ``kinds`` lists several kinds: one is
picked at random each time. ``reject_keys`` answers ExpiredToken to requests
signed with one of those access key ids (rotated credentials).

Control (plain HTTP on the control port, JSON): ``PUT /rules`` sets the rules
(a list), ``GET /stats`` returns counters (requests and body bytes sent per
operation, ``requests_<op>`` and ``body_bytes_<op>``, and per operation and object too,
``requests_<op> /bucket/key`` and ``body_bytes_<op> /bucket/key``; faults per kind; and
``most_at_once_<op>``: the most requests of an operation answered at once),
``POST /reset-stats`` clears them.
The :class:`FaultProxy` class starts it as a subprocess and stops it by PID.

Run: python faultproxy.py LISTEN_PORT CONTROL_PORT UPSTREAM_PORT [SEED]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from procs import stop

_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{msg}</Message>'
    "<RequestId>zvfs-faultproxy</RequestId></Error>"
)
_STATUS = {
    "503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "500": (500, "Internal Server Error", "InternalError",
            "We encountered an internal error. Please try again."),
    "429": (429, "Too Many Requests", "TooManyRequests", "Too many requests."),
    "403": (403, "Forbidden", "AccessDenied", "Access Denied"),
    "expired": (403, "Forbidden", "ExpiredToken", "The provided token has expired."),
    "404": (404, "Not Found", "NoSuchKey", "The specified key does not exist."),
    "nosuchupload": (404, "Not Found", "NoSuchUpload", "The specified multipart upload does not exist."),
    "unconditional": (501, "Not Implemented", "NotImplemented",
                      "A header you provided implies functionality that is not implemented"),
}
KINDS = (*_STATUS, "reset", "truncate", "stall", "flip", "silent", "whole", "short", "endless", "trickle",
         "drip", "late", "ignore-condition", "lost")
_AKID = re.compile(r"Credential=([^/,\s]+)/")


@dataclass
class Rule:
    kinds: list[str]
    ops: set[str] = field(default_factory=lambda: {"get", "head", "list"})
    rate: float = 1.0
    count: int | None = None
    window: tuple[float, float] | None = None
    stall: float = 30.0
    key: str | None = None  # only requests whose path contains this
    fired: int = 0

    @classmethod
    def parse(cls, doc: dict[str, Any]) -> Rule:
        kinds = doc.get("kinds") or [doc["kind"]]
        for k in kinds:
            if k not in KINDS:
                raise ValueError(f"unknown fault kind {k!r}")
        window = doc.get("window")
        return cls(kinds=list(kinds), ops=set(doc.get("ops", ["get", "head", "list"])),
                   rate=float(doc.get("rate", 1.0)), count=doc.get("count"),
                   window=tuple(window) if window else None, stall=float(doc.get("stall", 30.0)),
                   key=doc.get("key"))


class Proxy:
    def __init__(self, upstream_port: int, seed: int) -> None:
        self.upstream_port = upstream_port
        self.rules: list[Rule] = []
        self.reject_keys: set[str] = set()
        self.rules_set_at = time.monotonic()
        #: set (and replaced) whenever the rules are: what the silent connections wait on
        self.rules_changed = asyncio.Event()
        self.random = random.Random(seed)
        self.stats: Counter[str] = Counter()
        #: requests of each operation being answered now (stats: most_at_once_<op>, the peak)
        self.serving: Counter[str] = Counter()

    # -- choosing a fault -------------------------------------------------------------

    def choose(self, op: str, path: str, headers: dict[str, str]) -> str | None:
        m = _AKID.search(headers.get("authorization", ""))
        if m and m.group(1) in self.reject_keys:
            return "expired"
        now = time.monotonic() - self.rules_set_at
        for rule in self.rules:
            if op not in rule.ops or (rule.key and rule.key not in path):
                continue
            if rule.window and not rule.window[0] <= now < rule.window[1]:
                continue
            if rule.count is not None and rule.fired >= rule.count:
                continue
            if self.random.random() >= rule.rate:
                continue
            rule.fired += 1
            return self.random.choice(rule.kinds)
        return None

    # -- serving ----------------------------------------------------------------------

    async def client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        serving: str | None = None  # the operation this connection is answering
        try:
            while True:
                if serving is not None:  # answered: the loop is back for the next request
                    self.serving[serving] -= 1
                    serving = None
                request = await _read_message(reader, is_request=True, continue_to=writer)
                if request is None:
                    return
                line, headers, body = request
                method, target = line.split(" ")[:2]
                op = _operation(method, target)
                self.stats[f"requests_{op}"] += 1
                where = target.partition("?")[0]  # the object (or bucket) asked of
                self.stats[f"requests_{op} {where}"] += 1
                serving = op
                self.serving[op] += 1
                self.stats[f"most_at_once_{op}"] = max(self.stats[f"most_at_once_{op}"], self.serving[op])
                fault = self.choose(op, target, headers)
                if fault in ("unconditional", "ignore-condition") and "if-none-match" not in headers:
                    fault = None  # only a conditional request is concerned
                if fault is not None:
                    self.stats[f"fault_{fault}"] += 1
                    self.stats["faults"] += 1
                if fault in _STATUS:
                    writer.write(_error_response(fault, method == "HEAD"))
                    await writer.drain()
                    continue
                if fault == "reset":
                    _reset(writer)
                    return
                if fault == "silent":
                    # until the client gives up and closes, or the rules change: then reset
                    gone = asyncio.ensure_future(reader.read())
                    changed = asyncio.ensure_future(self.rules_changed.wait())
                    done, _ = await asyncio.wait({gone, changed}, return_when=asyncio.FIRST_COMPLETED)
                    gone.cancel()
                    changed.cancel()
                    if gone not in done:
                        _reset(writer)
                    return
                if fault == "stall":
                    await asyncio.sleep(self._stall_of(op, "stall"))
                    _reset(writer)
                    return
                if fault == "late":
                    await asyncio.sleep(self._stall_of(op, "late"))
                if fault == "endless":
                    writer.write(_serialize("HTTP/1.1 200 OK", {"content-length": str(1 << 40)}, b""))
                    zeros = bytes(1 << 16)
                    while True:  # until the client closes
                        writer.write(zeros)
                        await writer.drain()
                if fault == "whole":
                    headers = {k: v for k, v in headers.items() if k != "range"}
                if fault == "ignore-condition":
                    headers = {k: v for k, v in headers.items() if k != "if-none-match"}
                if upstream is None:
                    upstream = await asyncio.open_connection("127.0.0.1", self.upstream_port)
                up_reader, up_writer = upstream
                up_writer.write(_serialize(line, headers, body))
                await up_writer.drain()
                response = await _read_message(up_reader, is_request=False, head=method == "HEAD")
                if response is None:
                    _reset(writer)
                    return
                if fault == "lost":
                    _reset(writer)
                    return
                status_line, rheaders, rbody = response
                if rheaders.get("connection", "").lower() == "close":
                    up_writer.close()
                    upstream = None
                rheaders.pop("connection", None)
                rheaders.pop("transfer-encoding", None)
                if method != "HEAD":
                    rheaders["content-length"] = str(len(rbody))
                if fault == "flip" and not any(h.startswith("x-amz-checksum-") for h in rheaders):
                    # no checksum for the client to check (a range, an old object): S3's
                    # integrity promise does not cover it, so neither does this fault
                    self.stats["fault_flip"] -= 1
                    self.stats["faults"] -= 1
                    self.stats["flip_not_checkable"] += 1
                elif fault == "flip" and rbody:
                    i = len(rbody) // 2
                    rbody = rbody[:i] + bytes([rbody[i] ^ 0xFF]) + rbody[i + 1:]
                if fault == "truncate" and len(rbody) <= 1:  # nothing to cut (HEAD, empty)
                    self.stats["fault_truncate"] -= 1
                    self.stats["faults"] -= 1
                elif fault == "truncate":
                    self.stats[f"body_bytes_{op}"] += len(rbody) // 2
                    self.stats[f"body_bytes_{op} {where}"] += len(rbody) // 2
                    writer.write(_serialize(status_line, rheaders, rbody[: len(rbody) // 2]))
                    await writer.drain()
                    writer.close()  # a clean close, short of the announced Content-Length
                    return
                if fault == "short":
                    m = re.match(r"bytes (\d+)-(\d+)/(\d+)", rheaders.get("content-range", ""))
                    if m and len(rbody) > 1:
                        first, total = int(m.group(1)), m.group(3)
                        rbody = rbody[: len(rbody) // 2]
                        rheaders["content-range"] = f"bytes {first}-{first + len(rbody) - 1}/{total}"
                        rheaders["content-length"] = str(len(rbody))
                    else:  # not a range: nothing to shorten
                        self.stats["fault_short"] -= 1
                        self.stats["faults"] -= 1
                self.stats[f"body_bytes_{op}"] += len(rbody)
                self.stats[f"body_bytes_{op} {where}"] += len(rbody)
                if fault == "trickle":
                    writer.write(_serialize(status_line, rheaders, b""))
                    await _dribble(writer, rbody)
                    continue
                if fault == "drip":
                    await _dribble(writer, _serialize(status_line, rheaders, rbody))
                    continue
                writer.write(_serialize(status_line, rheaders, rbody))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            if serving is not None:
                self.serving[serving] -= 1
            if upstream is not None:
                upstream[1].close()
            with contextlib.suppress(Exception):
                writer.close()

    def _stall_of(self, op: str, kind: str) -> float:
        for rule in self.rules:
            if kind in rule.kinds and op in rule.ops:
                return rule.stall
        return 30.0

    # -- control ----------------------------------------------------------------------

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await _read_message(reader, is_request=True)
            if request is None:
                return
            line, _headers, body = request
            method, target = line.split(" ")[:2]
            status, out = "200 OK", b"{}"
            try:
                if method == "PUT" and target == "/rules":
                    doc = json.loads(body or b"{}")
                    self.rules = [Rule.parse(r) for r in doc.get("rules", [])]
                    self.reject_keys = set(doc.get("reject_keys", []))
                    self.rules_set_at = time.monotonic()
                    self.rules_changed.set()
                    self.rules_changed = asyncio.Event()
                elif method == "GET" and target == "/stats":
                    out = json.dumps(dict(self.stats)).encode()
                elif method == "POST" and target == "/reset-stats":
                    self.stats.clear()
                else:
                    status = "404 Not Found"
            except (ValueError, KeyError) as exc:
                status, out = "400 Bad Request", json.dumps({"error": str(exc)}).encode()
            writer.write(_serialize(f"HTTP/1.1 {status}", {"content-type": "application/json",
                                                            "connection": "close"}, out))
            await writer.drain()
        finally:
            writer.close()


async def _dribble(writer: asyncio.StreamWriter, data: bytes) -> None:
    """``data`` a byte every 0.25 s: each inside any timeout between bytes."""
    for i in range(len(data)):
        writer.write(data[i:i + 1])
        await writer.drain()
        await asyncio.sleep(0.25)


def _operation(method: str, target: str) -> str:
    path, _, query = target.partition("?")
    if method == "HEAD":
        return "head"
    if method == "GET":
        parts = [p for p in path.split("/") if p]
        return "list" if len(parts) <= 1 or "list-type" in query else "get"
    if method == "PUT":
        return "put"
    return "other"


async def _read_message(
    reader: asyncio.StreamReader, is_request: bool, head: bool = False,
    continue_to: asyncio.StreamWriter | None = None,
) -> tuple[str, dict[str, str], bytes] | None:
    """One HTTP/1.1 message. A request that says ``Expect: 100-continue`` (boto3's PUTs)
    is told to go on through ``continue_to`` and forwarded without the header; interim
    1xx responses are skipped."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return None
    lines = raw.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for h in lines[1:]:
        if ":" in h:
            k, _, v = h.partition(":")
            headers[k.strip().lower()] = v.strip()
    if is_request and headers.get("expect", "").lower() == "100-continue":
        headers.pop("expect")
        if continue_to is not None:
            continue_to.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await continue_to.drain()
    if head:
        return lines[0], headers, b""
    status = 0 if is_request else int(lines[0].split(" ")[1])
    if not is_request and 100 <= status < 200:
        return await _read_message(reader, is_request, head)
    if not is_request and status in (204, 304):
        return lines[0], headers, b""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            body += await reader.readexactly(size)
            await reader.readuntil(b"\r\n")
            if size == 0:
                break
        return lines[0], headers, body
    if "content-length" in headers:
        return lines[0], headers, await reader.readexactly(int(headers["content-length"]))
    if is_request:
        return lines[0], headers, b""
    return lines[0], headers, await reader.read()  # until the server closes


def _serialize(first: str, headers: dict[str, str], body: bytes) -> bytes:
    out = [first] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + body


def _error_response(kind: str, head: bool) -> bytes:
    status, reason, code, msg = _STATUS[kind]
    body = _XML.format(code=code, msg=msg).encode()
    headers = {"content-type": "application/xml", "content-length": str(len(body)),
               "x-amz-request-id": "zvfs-faultproxy"}
    if status == 503:
        headers["retry-after"] = "0"
    return _serialize(f"HTTP/1.1 {status} {reason}", headers, b"" if head else body)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0): the client sees 'connection reset by peer'."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


async def _main(port: int, control_port: int, upstream: int, seed: int) -> None:
    proxy = Proxy(upstream, seed)
    server = await asyncio.start_server(proxy.client, "127.0.0.1", port, limit=1 << 24)
    control = await asyncio.start_server(proxy.control, "127.0.0.1", control_port)
    # the ports bound (0 asks the kernel for free ones: a port found free beforehand may be
    # taken by someone's outgoing connection before the bind, and the proxy failed to start)
    bound = [srv.sockets[0].getsockname()[1] for srv in (server, control)]
    print("ready", *bound, flush=True)
    async with server, control:
        await asyncio.gather(server.serve_forever(), control.serve_forever())


# -- the test side --------------------------------------------------------------------


class FaultProxy:
    """The proxy as a subprocess in front of ``upstream_port``; stopped by PID."""

    def __init__(self, upstream_port: int, seed: int = 0) -> None:
        self.port = 0  # the ports the proxy binds, once started
        self.control_port = 0
        self.upstream_port = upstream_port
        self.seed = seed
        self.proc: subprocess.Popen[str] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(self.port), str(self.control_port),
             str(self.upstream_port), str(self.seed)],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        said = self.proc.stdout.readline().split()
        if len(said) != 3 or said[0] != "ready":
            self.stop()
            raise RuntimeError("the fault proxy did not start")
        self.port, self.control_port = int(said[1]), int(said[2])
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
        self.proc = None

    def _call(self, method: str, path: str, doc: Any = None) -> Any:
        data = json.dumps(doc).encode() if doc is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.control_port}{path}", data=data,
                                     method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read() or b"{}")

    def set(self, *rules: dict[str, Any], reject_keys: list[str] | None = None) -> None:
        """Replace the rules (none: a clean pass-through)."""
        self._call("PUT", "/rules", {"rules": list(rules), "reject_keys": reject_keys or []})

    def clear(self) -> None:
        self.set()

    def stats(self) -> dict[str, int]:
        return self._call("GET", "/stats")

    def reset_stats(self) -> None:
        self._call("POST", "/reset-stats", {})

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:5]]
    if len(args) < 3:
        sys.exit(__doc__.rsplit("Run: ", 1)[1])
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args[0], args[1], args[2], args[3] if len(args) > 3 else 0))
