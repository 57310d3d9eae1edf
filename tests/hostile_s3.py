"""A small S3 server on 127.0.0.1 whose listings can lie: what moto cannot be made to send.

It serves ListObjectsV2 (prefix, delimiter, continuation, URL encoding), HeadBucket,
HeadObject, GetObject (with a single Range) and a plain PutObject over a dict of keys,
over HTTP or HTTPS (``tls=(certfile, keyfile)``), and its listings can
carry what a broken or hostile server sends: sizes no file can have, dates that are no
dates, and continuation tokens that loop. Everything else about it is plain S3, so zvfs
mounts it with ``--endpoint-url`` and ``--no-sign-request``. It runs in a thread of the
test process; the zvfs daemon talks to it over loopback.
"""

from __future__ import annotations

import email.utils
import hashlib
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.sax.saxutils import escape


@dataclass
class Listed:
    """What the listing says of one key (None: the truth)."""

    size: object = None
    last_modified: str | None = None


@dataclass
class HostileS3:
    bucket: str
    objects: dict[str, bytes] = field(default_factory=dict)
    lies: dict[str, Listed] = field(default_factory=dict)
    #: every listing page is truncated and hands back this same token
    loop_token: str | None = None
    page_keys: int = 1000
    #: truncated pages carry no NextContinuationToken (as a server speaking only V1 sends)
    no_token: bool = False
    #: a server that knows only ListObjects V1: continuation-token and start-after are
    #: ignored, pages go on from ``marker`` (and never carry a token)
    v1_only: bool = False
    #: GETs and HEADs honour If-Match (a strict comparison with the quoted ETag), as S3 does
    if_match: bool = False
    #: listings give ETags without their quotes (the GET's header keeps them)
    bare_list_etags: bool = False
    #: ListMultipartUploads: every page lists one upload, is truncated and hands back the
    #: same markers (None: no uploads, one page)
    uploads_loop: str | None = None
    #: listings past the first ``pad_after`` carry this many bytes of blanks inside their
    #: document (sent 1 MiB at a time, until the client hangs up; with no Content-Length,
    #: the body ending when the connection closes, unless ``pad_announced``)
    pad: int = 0
    pad_after: int = 1
    pad_announced: bool = False
    listings: int = 0
    #: listings with a delimiter also give the asked prefix as one of its own common
    #: prefixes (a directory holding itself)
    self_prefix: bool = False
    #: listings with a delimiter give each common prefix twice
    repeat_prefixes: bool = False
    #: headers left out of every HEAD's answer (a small server's HEAD may lack some)
    head_without: tuple[str, ...] = ()
    #: the size a HEAD of these keys gives (their GETs send the whole object)
    head_sizes: dict[str, int] = field(default_factory=dict)
    #: headers added to every GET's answer (e.g. a Content-Encoding the body does not have)
    get_headers: dict[str, str] = field(default_factory=dict)
    #: a GET of an object is answered with this status (and an S3 error body of ``error_code``)
    get_status: int = 0
    error_code: str = ""
    #: more elements of that error body (as S3 adds <Region> to AuthorizationHeaderMalformed)
    error_fields: dict[str, str] = field(default_factory=dict)
    #: listings are answered with this status and S3 error code (0: listed)
    list_status: int = 0
    #: listings of these prefixes are refused (403 AccessDenied), as a policy may refuse them
    refused_prefixes: tuple[str, ...] = ()
    #: every listing page is empty and truncated, handing back a new token each time
    empty_pages: bool = False
    #: listings in reverse order (as S3 Express directory buckets, unsorted), paged by index
    unsorted: bool = False
    #: the first page of each listing is empty, and truncated (the keys come after it)
    empty_first: bool = False
    #: listings ignore the prefix asked for: every key of the bucket is listed
    ignore_prefix: bool = False
    #: GETs served, by key (a test replaces an object between two of them)
    gets: dict[str, int] = field(default_factory=dict)
    #: a suffix range (``bytes=-N``) is answered with the whole object, as a 206 whose
    #: Content-Range says so (a server that does not know suffix ranges)
    suffix_whole: bool = False
    #: the Range of every GET, with its key, in order
    ranges: list[tuple[str, str | None]] = field(default_factory=list)
    #: serve HTTPS with this (certificate file, key file)
    tls: tuple[str, str] | None = None
    #: what a PUT whose body is in aws-chunked encoding (botocore's checksum trailers) gets,
    #: as S3-compatible servers that predate that encoding answer it: "refuse" (501
    #: NotImplemented) or "store" (the content stored as it came, aws-chunked framing and all)
    aws_chunked: str = "refuse"
    #: the headers of every PUT received, in order
    puts: list[dict[str, str]] = field(default_factory=list)
    #: every PUT is answered with this status and no body (0: stored)
    put_status: int = 0

    def __post_init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # an answer is two writes (headers, then body): with Nagle's algorithm the body
            # waited for the client's delayed ACK, 40 ms an answer (~20 requests a second)
            disable_nagle_algorithm = True

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:  # noqa: N802
                server._head(self)

            def do_GET(self) -> None:  # noqa: N802
                server._get(self)

            def do_PUT(self) -> None:  # noqa: N802
                server._put(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        scheme = "http"
        if self.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True)
            scheme = "https"
        self.endpoint = f"{scheme}://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> HostileS3:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- requests ------------------------------------------------------------------------

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str]) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def _split(self, h: BaseHTTPRequestHandler) -> tuple[str, dict[str, str]]:
        url = urllib.parse.urlsplit(h.path)
        path = urllib.parse.unquote(url.path).lstrip("/")
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        bucket, _, key = path.partition("/")
        if bucket != self.bucket:
            self._send(h, 404, b"<Error><Code>NoSuchBucket</Code></Error>", {})
            return "", {"_refused": "1"}
        return key, query

    def _head(self, h: BaseHTTPRequestHandler) -> None:
        key, query = self._split(h)
        if "_refused" in query:
            return
        if not key:
            self._send(h, 200, b"", {})
        elif key in self.objects:
            headers = {k: v for k, v in self._object_headers(key).items() if k not in self.head_without}
            size = self.head_sizes.get(key)
            self._send(h, 200, self.objects[key] if size is None else bytes(size), headers)
        else:
            self._send(h, 404, b"", {})

    def _object_headers(self, key: str) -> dict[str, str]:
        return {"ETag": f'"{hashlib.md5(self.objects[key]).hexdigest()}"',  # noqa: S324 - S3's ETag
                "Last-Modified": email.utils.formatdate(usegmt=True)}

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        key, query = self._split(h)
        if "_refused" in query:
            return
        if not key and "uploads" in query:
            self._uploads(h)
            return
        if not key:
            self._list(h, query)
            return
        data = self.objects.get(key)
        if data is None:
            self._send(h, 404, b"<Error><Code>NoSuchKey</Code></Error>", {})
            return
        self.gets[key] = self.gets.get(key, 0) + 1
        if self.get_status:
            body = self._error_body()
            self._send(h, self.get_status, body, {"Location": self.endpoint + h.path})
            return
        headers = self._object_headers(key) | self.get_headers
        wanted = h.headers.get("If-Match")
        if self.if_match and wanted is not None and wanted not in ("*", headers["ETag"]):
            self._send(h, 412, b"<Error><Code>PreconditionFailed</Code></Error>", {})
            return
        rng = h.headers.get("Range")
        self.ranges.append((key, rng))
        if rng and rng.startswith("bytes="):
            first, _, last = rng[6:].partition("-")
            if first == "" and self.suffix_whole:
                start, end = 0, len(data) - 1
            elif first == "":  # a suffix
                start = max(0, len(data) - int(last))
                end = len(data) - 1
            else:
                start = int(first)
                end = min(len(data) - 1, int(last)) if last else len(data) - 1
            if start >= len(data):
                self._send(h, 416, b"<Error><Code>InvalidRange</Code></Error>", {})
                return
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self._send(h, 206, data[start:end + 1], headers)
            return
        self._send(h, 200, data, headers)

    def _put(self, h: BaseHTTPRequestHandler) -> None:
        """A PutObject of a plain body (Content-Length; or chunked, as ``aws_chunked`` says)."""
        key, query = self._split(h)
        if "_refused" in query:
            return
        self.puts.append(dict(h.headers.items()))
        if self.put_status:
            h.close_connection = True  # its body is not read
            self._send(h, self.put_status, b"", {})
            return
        chunked = "aws-chunked" in h.headers.get("Content-Encoding", "") or h.headers.get(
            "Transfer-Encoding", "").lower() == "chunked"
        if chunked and self.aws_chunked == "refuse":
            h.close_connection = True  # its body is not read
            body = (b"<Error><Code>NotImplemented</Code><Message>A header you provided implies "
                    b"functionality that is not implemented</Message></Error>")
            self._send(h, 501, body, {})
            return
        data = self._chunked_body(h) if chunked else h.rfile.read(int(h.headers.get("Content-Length", 0)))
        if key and h.headers.get("If-None-Match") == "*" and key in self.objects:
            self._send(h, 412, b"<Error><Code>PreconditionFailed</Code></Error>", {})
            return
        self.objects[key] = data
        self._send(h, 200, b"", {"ETag": self._object_headers(key)["ETag"]})

    @staticmethod
    def _chunked_body(h: BaseHTTPRequestHandler) -> bytes:
        """An HTTP/1.1 chunked body, de-chunked: its content as a server that knows HTTP but
        not aws-chunked keeps it (the aws-chunked framing and trailer inside included)."""
        out = bytearray()
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # HTTP trailers
                return bytes(out)
            out += h.rfile.read(size)
            h.rfile.readline()

    def _error_body(self) -> bytes:
        extra = "".join(f"<{k}>{escape(v)}</{k}>" for k, v in self.error_fields.items())
        return f"<Error><Code>{self.error_code}</Code><Message>m</Message>{extra}</Error>".encode()

    def _list(self, h: BaseHTTPRequestHandler, q: dict[str, str]) -> None:
        if self.list_status:
            body = self._error_body()
            self._send(h, self.list_status, body, {"x-amz-request-id": "hostile"})
            return
        prefix, delim = q.get("prefix", ""), q.get("delimiter", "")
        if prefix in self.refused_prefixes:
            body = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
            self._send(h, 403, body, {"x-amz-request-id": "hostile"})
            return
        encode = q.get("encoding-type") == "url"
        after = q.get("marker") or ("" if self.v1_only else
                                    q.get("continuation-token") or q.get("start-after") or "")
        if after.startswith("tok:"):
            after = after[4:]
        entries: list[tuple[str, bool]] = []  # (name, is a common prefix)
        seen_prefixes: set[str] = set()
        scope = "" if self.ignore_prefix else prefix
        for key in sorted(self.objects):
            if not key.startswith(scope):
                continue
            rest = key[len(scope):]
            if delim and delim in rest:
                cp = scope + rest[: rest.index(delim) + 1]
                if cp not in seen_prefixes:
                    seen_prefixes.add(cp)
                    entries.append((cp, True))
                    if self.repeat_prefixes:
                        entries.append((cp, True))
            else:
                entries.append((key, False))
        if self.self_prefix and delim and prefix.endswith(delim):
            entries.insert(0, (prefix, True))
        if self.unsorted:
            entries.reverse()
            entries = entries[int(after[4:]):] if after.startswith("idx:") else entries
        else:
            entries = [e for e in entries if e[0] > after]
        page, more = entries[: self.page_keys], len(entries) > self.page_keys
        if self.empty_pages and q.get("continuation-token"):
            page, more = [], True
        first_empty = self.empty_first and not q.get("continuation-token")
        if first_empty:
            page, more = [], True
        if self.loop_token is not None:
            more = True

        def name(s: str) -> str:
            return escape(urllib.parse.quote(s, safe="/") if encode else s)

        out = ['<?xml version="1.0" encoding="UTF-8"?>',
               '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
               f"<Name>{self.bucket}</Name><Prefix>{name(prefix)}</Prefix>",
               f"<KeyCount>{len(page)}</KeyCount><MaxKeys>{self.page_keys}</MaxKeys>",
               f"<IsTruncated>{'true' if more else 'false'}</IsTruncated>"]
        if delim:
            out.append(f"<Delimiter>{escape(delim)}</Delimiter>")
        if encode:
            out.append("<EncodingType>url</EncodingType>")
        if more and not self.no_token and not self.v1_only:
            if first_empty:
                token = "tok:"  # from the start
            elif self.empty_pages:
                token = f"empty:{self.listings}"
            elif self.unsorted:
                token = f"idx:{int(after[4:] if after.startswith('idx:') else 0) + len(page)}"
            else:
                token = self.loop_token if self.loop_token is not None else "tok:" + page[-1][0]
            out.append(f"<NextContinuationToken>{escape(token)}</NextContinuationToken>")
        quote = "" if self.bare_list_etags else '"'
        for entry, is_prefix in page:
            if is_prefix:
                out.append(f"<CommonPrefixes><Prefix>{name(entry)}</Prefix></CommonPrefixes>")
                continue
            lie = self.lies.get(entry, Listed())
            size = len(self.objects[entry]) if lie.size is None else lie.size
            when = lie.last_modified or "2026-11-28T10:00:00.000Z"
            out.append(f"<Contents><Key>{name(entry)}</Key><LastModified>{escape(when)}</LastModified>"
                       f"<ETag>{quote}{hashlib.md5(self.objects[entry]).hexdigest()}{quote}</ETag>"  # noqa: S324
                       f"<Size>{escape(str(size))}</Size><StorageClass>STANDARD</StorageClass></Contents>")
        self.listings += 1
        if self.pad and self.listings > self.pad_after:
            head, tail = "".join(out).encode(), b"</ListBucketResult>"
            h.send_response(200)
            h.send_header("Content-Type", "application/xml")
            if self.pad_announced:
                h.send_header("Content-Length", str(len(head) + self.pad + len(tail)))
            else:
                h.send_header("Connection", "close")
                h.close_connection = True
            h.end_headers()
            h.wfile.write(head)
            blanks, left = b" " * (1 << 20), self.pad
            try:
                while left > 0:
                    h.wfile.write(blanks[:left])
                    left -= len(blanks)
                h.wfile.write(tail)
            except OSError:
                pass  # the client hung up
            return
        out.append("</ListBucketResult>")
        self._send(h, 200, "".join(out).encode(), {"Content-Type": "application/xml"})

    def _uploads(self, h: BaseHTTPRequestHandler) -> None:
        out = ['<?xml version="1.0" encoding="UTF-8"?>',
               '<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
               f"<Bucket>{self.bucket}</Bucket>"]
        if self.uploads_loop is None:
            out.append("<IsTruncated>false</IsTruncated>")
        else:
            marker = escape(self.uploads_loop)
            out.append(f"<NextKeyMarker>{marker}</NextKeyMarker>"
                       f"<NextUploadIdMarker>{marker}</NextUploadIdMarker><IsTruncated>true</IsTruncated>"
                       f"<Upload><Key>s/{marker}</Key><UploadId>{marker}</UploadId>"
                       "<Initiated>2026-11-28T10:00:00.000Z</Initiated></Upload>")
        out.append("</ListMultipartUploadsResult>")
        self._send(h, 200, "".join(out).encode(), {"Content-Type": "application/xml"})
