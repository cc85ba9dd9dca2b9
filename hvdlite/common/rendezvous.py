"""Authenticated key-value rendezvous service.

Ranks of an hvdlite job find each other through a small HTTP key-value
store run by the launcher.  Each rank publishes its own address under a
key (usually its rank) inside a *scope* (usually one per job phase) and
then fetches the entries of its peers, waiting for them if they are not
there yet (long-polling).

HTTP API (all values are opaque bytes)::

    PUT    /kv/<scope>/<key>              body = value          -> 204
    GET    /kv/<scope>/<key>?wait=<secs>  long-poll (<= 30 s)   -> 200 value / 404
    DELETE /kv/<scope>                    drop the whole scope  -> 204

Scope and key are percent-encoded path segments.

Authentication
--------------
Every request must carry three headers::

    X-Hvdlite-Timestamp   unix time in seconds, as decimal text
    X-Hvdlite-Nonce       random hex string, used once
    X-Hvdlite-Auth        hex HMAC-SHA256(secret, canonical request)

where the canonical request is::

    METHOD "\\n" path_with_query "\\n" timestamp "\\n" nonce "\\n" sha256hex(body)

The server answers 403 (and changes nothing) when the MAC is missing or
wrong, when the timestamp is more than ``MAX_CLOCK_SKEW`` seconds away from
its own clock, or when a nonce is seen a second time (nonces are remembered
for ``NONCE_TTL`` seconds, longer than the accepted timestamp window, so a
captured request cannot be replayed).  Bodies above ``MAX_BODY_SIZE`` get
413 and malformed paths get 400.

Responses are not authenticated: the service protects the store against
unauthenticated writers and readers, and it is meant to run on a trusted
network segment between the launcher and its ranks.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import http.client
import http.server
import logging
import math
import os
import secrets
import socket
import socketserver
import threading
import time
import urllib.parse
from typing import Dict, List, Mapping, Optional, Tuple

__all__ = [
    "RendezvousServer",
    "RendezvousClient",
    "RendezvousError",
    "exchange_all",
    "sign_request",
    "client_from_env",
    "MAX_BODY_SIZE",
    "MAX_WAIT",
    "MAX_CLOCK_SKEW",
    "NONCE_TTL",
]

logger = logging.getLogger("hvdlite.rendezvous")

# ---------------------------------------------------------------------------
# Protocol constants
# ---------------------------------------------------------------------------

#: Largest accepted request body (bytes).
MAX_BODY_SIZE = 1 << 20
#: Longest server-side long-poll for one GET (seconds).
MAX_WAIT = 30.0
#: Largest accepted difference between the request timestamp and server clock.
MAX_CLOCK_SKEW = 60.0
#: How long a used nonce is remembered.  A request is only accepted while its
#: timestamp is within MAX_CLOCK_SKEW of the server clock, so keeping nonces
#: for longer than that window (both directions) closes the replay window.
NONCE_TTL = 120.0
#: Upper bound on the length of a scope or key (after percent-decoding).
MAX_NAME_LENGTH = 512
#: Nonce length limits, in hex characters.
MIN_NONCE_LENGTH = 16
MAX_NONCE_LENGTH = 128

HEADER_TIMESTAMP = "X-Hvdlite-Timestamp"
HEADER_NONCE = "X-Hvdlite-Nonce"
HEADER_AUTH = "X-Hvdlite-Auth"

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def _body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def sign_request(secret: bytes, method: str, path: str, timestamp: str, nonce: str, body: bytes = b"") -> str:
    """Return the hex HMAC-SHA256 that authenticates one request.

    ``path`` is the request target exactly as sent on the request line,
    query string included (e.g. ``/kv/job/0?wait=30.000``).
    """
    message = "\n".join((method.upper(), path, timestamp, nonce, _body_digest(body)))
    return hmac.new(secret, message.encode("utf-8"), hashlib.sha256).hexdigest()


def _auth_headers(secret: bytes, method: str, path: str, body: bytes) -> Dict[str, str]:
    """Fresh timestamp, nonce and MAC headers for one request attempt."""
    timestamp = "%.6f" % time.time()
    nonce = secrets.token_hex(16)
    return {
        HEADER_TIMESTAMP: timestamp,
        HEADER_NONCE: nonce,
        HEADER_AUTH: sign_request(secret, method, path, timestamp, nonce, body),
    }


def _kv_path(scope: str, key: Optional[str] = None) -> str:
    """Percent-encoded request path for a scope (and optionally a key)."""
    _check_name("scope", scope)
    path = "/kv/" + urllib.parse.quote(scope, safe="")
    if key is not None:
        _check_name("key", key)
        path += "/" + urllib.parse.quote(key, safe="")
    return path


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError("rendezvous %s must be a non-empty string" % what)
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError("rendezvous %s is longer than %d characters" % (what, MAX_NAME_LENGTH))


class RendezvousError(RuntimeError):
    """An unexpected answer from the rendezvous server."""

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------


class _RequestRejected(Exception):
    """Raised inside the handler to answer with an error status."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _Store:
    """Thread-safe scope -> key -> value store plus the nonce cache."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._data: Dict[str, Dict[str, bytes]] = {}
        # nonce -> monotonic time first seen, in insertion (= time) order.
        self._nonces: "collections.OrderedDict[str, float]" = collections.OrderedDict()
        self._closed = False

    # -- nonces -------------------------------------------------------------

    def use_nonce(self, nonce: str) -> bool:
        """Record ``nonce``; False if it was already used within NONCE_TTL."""
        now = time.monotonic()
        with self._lock:
            # Entries are ordered by insertion time: drop expired ones from
            # the front so the cache stays proportional to the request rate.
            while self._nonces:
                oldest, seen = next(iter(self._nonces.items()))
                if now - seen <= NONCE_TTL:
                    break
                del self._nonces[oldest]
            if nonce in self._nonces:
                return False
            self._nonces[nonce] = now
            return True

    # -- key-value ----------------------------------------------------------

    def put(self, scope: str, key: str, value: bytes) -> None:
        with self._cond:
            self._data.setdefault(scope, {})[key] = value
            self._cond.notify_all()

    def get(self, scope: str, key: str, wait: float) -> Optional[bytes]:
        """Value of scope/key, waiting up to ``wait`` seconds for it."""

        def lookup() -> Optional[bytes]:
            return self._data.get(scope, {}).get(key)

        deadline = time.monotonic() + wait
        with self._cond:
            value = lookup()
            while value is None and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
                value = lookup()
            return value

    def delete_scope(self, scope: str) -> None:
        with self._cond:
            self._data.pop(scope, None)
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wake every long-poll so handler threads finish promptly."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def snapshot(self) -> Dict[str, Dict[str, bytes]]:
        """Deep copy of the store (for tests and debugging)."""
        with self._lock:
            return {scope: dict(keys) for scope, keys in self._data.items()}


class _Handler(http.server.BaseHTTPRequestHandler):
    """Request handler; one instance per connection, on its own thread."""

    server: "_HTTPServer"
    server_version = "hvdlite-rendezvous/1"
    sys_version = ""
    # HTTP/1.0: one request per connection.  Rendezvous traffic is tiny and
    # this keeps idle connections from pinning handler threads.
    protocol_version = "HTTP/1.0"
    # A request line without a version is answered as HTTP/1.0 (with a status line), not as HTTP/0.9, whose
    # answers are a bare body a client cannot tell from data (found by tests/test_rendezvous.py's fuzzing).
    default_request_version = "HTTP/1.0"
    # Socket timeout for reads: a peer that connects and then stalls (or
    # sends half a request) is dropped after this long.  Long-polls wait on a
    # condition variable, not on the socket, so they are unaffected.
    timeout = 45.0

    # -- plumbing -----------------------------------------------------------

    def handle(self) -> None:
        # Contain everything a misbehaving peer can trigger; the server must
        # keep serving the other ranks.
        try:
            super().handle()
        except OSError as exc:  # resets, broken pipes, socket timeouts
            logger.debug("connection from %s dropped: %s", self.client_address, exc)
        except Exception:  # pragma: no cover - would be a bug in this module
            logger.exception("unexpected error while serving %s", self.client_address)

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        logger.debug("%s - %s", self.address_string(), format % args)

    def log_error(self, format: str, *args) -> None:  # noqa: A002
        # Called for parse errors and timeouts caused by the peer.
        logger.debug("%s - %s", self.address_string(), format % args)

    def address_string(self) -> str:
        # Never do reverse DNS lookups.
        return str(self.client_address[0])

    def _reply(self, status: int, body: bytes = b"", content_type: str = "application/octet-stream") -> None:
        self.send_response(status)
        if body or status not in (204, 304):
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _dispatch(self) -> None:
        try:
            body = self._read_body()
            self._authenticate(body)
            self._serve(body)
        except _RequestRejected as rejected:
            logger.debug(
                "%s %s rejected from %s: %d %s",
                self.command,
                self.path,
                self.client_address[0],
                rejected.status,
                rejected.reason,
            )
            self._reply(rejected.status, (rejected.reason + "\n").encode("utf-8"), "text/plain; charset=utf-8")

    do_GET = do_PUT = do_DELETE = _dispatch

    # -- request validation -------------------------------------------------

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise _RequestRejected(400, "chunked bodies are not supported")
        raw_length = self.headers.get("Content-Length")
        if raw_length is None:
            return b""
        try:
            length = int(raw_length.strip())
        except ValueError:
            raise _RequestRejected(400, "bad Content-Length") from None
        if length < 0:
            raise _RequestRejected(400, "bad Content-Length")
        if length > MAX_BODY_SIZE:
            # Do not read (or buffer) the oversized body at all.
            raise _RequestRejected(413, "body larger than %d bytes" % MAX_BODY_SIZE)
        body = self.rfile.read(length)
        if len(body) != length:
            raise _RequestRejected(400, "truncated body")
        return body

    def _authenticate(self, body: bytes) -> None:
        timestamp = self.headers.get(HEADER_TIMESTAMP)
        nonce = self.headers.get(HEADER_NONCE)
        mac = self.headers.get(HEADER_AUTH)
        if not timestamp or not nonce or not mac:
            raise _RequestRejected(403, "missing authentication headers")
        if not (MIN_NONCE_LENGTH <= len(nonce) <= MAX_NONCE_LENGTH and set(nonce) <= _HEX_DIGITS):
            raise _RequestRejected(403, "malformed nonce")
        expected = sign_request(self.server.secret, self.command, self.path, timestamp, nonce, body)
        # Constant-time comparison; encode so non-ASCII header garbage cannot
        # raise TypeError inside compare_digest.
        if not hmac.compare_digest(expected.encode("ascii"), mac.strip().encode("utf-8", "replace")):
            raise _RequestRejected(403, "bad signature")
        # The MAC covers the timestamp and nonce, so they can only be checked
        # meaningfully (and the nonce only be recorded) once it is verified.
        try:
            sent_at = float(timestamp)
        except ValueError:
            raise _RequestRejected(403, "malformed timestamp") from None
        if not math.isfinite(sent_at) or abs(time.time() - sent_at) > MAX_CLOCK_SKEW:
            raise _RequestRejected(403, "timestamp outside the accepted window")
        if not self.server.store.use_nonce(nonce.lower()):
            raise _RequestRejected(403, "nonce already used")

    def _parse_target(self) -> Tuple[List[str], Dict[str, List[str]]]:
        """Split the request target into decoded path segments after /kv/."""
        parts = urllib.parse.urlsplit(self.path)
        if parts.scheme or parts.netloc or parts.fragment:
            raise _RequestRejected(400, "malformed path")
        segments = parts.path.split("/")
        # "/kv/a/b" -> ["", "kv", "a", "b"]
        if len(segments) < 3 or segments[0] != "" or segments[1] != "kv":
            raise _RequestRejected(400, "malformed path")
        names = []
        for raw in segments[2:]:
            try:
                name = urllib.parse.unquote(raw, errors="strict")
            except UnicodeDecodeError:
                raise _RequestRejected(400, "malformed path") from None
            if not name or len(name) > MAX_NAME_LENGTH:
                raise _RequestRejected(400, "malformed path")
            names.append(name)
        try:
            query = urllib.parse.parse_qs(parts.query, strict_parsing=False, max_num_fields=8)
        except ValueError:
            raise _RequestRejected(400, "malformed query") from None
        return names, query

    # -- the actual API -----------------------------------------------------

    def _serve(self, body: bytes) -> None:
        names, query = self._parse_target()
        store = self.server.store
        if self.command == "PUT":
            if len(names) != 2:
                raise _RequestRejected(400, "expected /kv/<scope>/<key>")
            store.put(names[0], names[1], body)
            self._reply(204)
        elif self.command == "GET":
            if len(names) != 2:
                raise _RequestRejected(400, "expected /kv/<scope>/<key>")
            wait = 0.0
            if "wait" in query:
                try:
                    wait = float(query["wait"][-1])
                except ValueError:
                    raise _RequestRejected(400, "bad wait value") from None
                if not math.isfinite(wait):
                    raise _RequestRejected(400, "bad wait value")
                wait = min(max(wait, 0.0), MAX_WAIT)
            value = store.get(names[0], names[1], wait)
            if value is None:
                if store.closed:
                    raise _RequestRejected(503, "server shutting down")
                raise _RequestRejected(404, "not found")
            self._reply(200, value)
        elif self.command == "DELETE":
            if len(names) != 1:
                raise _RequestRejected(400, "expected /kv/<scope>")
            store.delete_scope(names[0])
            self._reply(204)
        else:  # pragma: no cover - only the three verbs are routed here
            raise _RequestRejected(405, "method not allowed")


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # Many ranks connect at once during rendezvous; the default backlog of 5
    # makes excess SYNs wait for a retransmit.
    request_queue_size = 128

    def __init__(self, address: Tuple[str, int], secret: bytes, store: _Store) -> None:
        self.secret = secret
        self.store = store
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind() calls socket.getfqdn(), which can block on
        # DNS for seconds; we do not need the server name.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = host
        self.server_port = port

    def handle_error(self, request, client_address) -> None:
        # Default prints a traceback to stderr; keep it in the logger.
        logger.debug("error while serving %s", client_address, exc_info=True)


class RendezvousServer:
    """Authenticated key-value store served over HTTP on a daemon thread.

    Usage::

        server = RendezvousServer(secret).start()
        host, port = server.address
        ...
        server.stop()

    It can also be used as a context manager (``with RendezvousServer(...)``).
    """

    def __init__(self, secret: bytes, host: str = "127.0.0.1", port: int = 0) -> None:
        if not isinstance(secret, (bytes, bytearray)) or not secret:
            raise ValueError("secret must be non-empty bytes")
        self._secret = bytes(secret)
        self._host = host
        self._port = port
        self._store = _Store()
        self._httpd: Optional[_HTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "RendezvousServer":
        """Bind the socket and start serving; returns ``self``."""
        if self._httpd is not None:
            raise RuntimeError("rendezvous server already started")
        self._httpd = _HTTPServer((self._host, self._port), self._secret, self._store)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="hvdlite-rendezvous", daemon=True
        )
        self._thread.start()
        logger.debug("rendezvous server listening on %s:%d", *self.address)
        return self

    def put(self, scope: str, key: str, value: bytes) -> None:
        """Stores a value directly, for the process that runs the server (no HTTP round trip)."""
        self._store.put(scope, key, bytes(value))

    def peek(self, scope: str, key: str) -> Optional[bytes]:
        """The value of scope/key, or None, without waiting (for the process that runs the server)."""
        return self._store.get(scope, key, wait=0)

    def stop(self) -> None:
        """Stop serving and close the socket.  Safe to call more than once."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()  # waits for serve_forever() to return
        self._store.close()  # releases pending long-polls
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    @property
    def address(self) -> Tuple[str, int]:
        """``(host, port)`` the server listens on (after :meth:`start`)."""
        if self._httpd is None:
            raise RuntimeError("rendezvous server is not running")
        host, port = self._httpd.server_address[:2]
        return host, port

    def snapshot(self) -> Dict[str, Dict[str, bytes]]:
        """Copy of the stored data (scope -> key -> value)."""
        return self._store.snapshot()

    def __enter__(self) -> "RendezvousServer":
        if self._httpd is None:
            self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


# ---------------------------------------------------------------------------
# Client
# ---------------------------------------------------------------------------


class RendezvousClient:
    """Client for :class:`RendezvousServer`.

    ``timeout`` bounds how long a request keeps retrying while the server
    refuses connections (it may still be starting) and is the socket timeout
    for ordinary requests.
    """

    #: Extra socket-timeout slack on top of the server-side long-poll time.
    _POLL_SLACK = 10.0

    def __init__(self, host: str, port: int, secret: bytes, timeout: float = 30.0) -> None:
        if not isinstance(secret, (bytes, bytearray)) or not secret:
            raise ValueError("secret must be non-empty bytes")
        self.host = host
        self.port = int(port)
        self.timeout = float(timeout)
        self._secret = bytes(secret)

    def __repr__(self) -> str:
        return "RendezvousClient(%s:%d)" % (self.host, self.port)

    # -- public API ---------------------------------------------------------

    def put(self, scope: str, key: str, value: bytes) -> None:
        """Store ``value`` under ``scope``/``key`` (overwriting)."""
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError("value must be bytes")
        value = bytes(value)
        if len(value) > MAX_BODY_SIZE:
            raise ValueError("value larger than %d bytes" % MAX_BODY_SIZE)
        status, body = self._request("PUT", _kv_path(scope, key), value)
        self._expect(status, body, (204, 200), "PUT", scope, key)

    def get(self, scope: str, key: str, wait: float = 30.0) -> bytes:
        """Value of ``scope``/``key``, waiting up to ``wait`` seconds.

        Long-polls the server repeatedly until the deadline; raises
        :class:`TimeoutError` if the key is still absent then.
        """
        base = _kv_path(scope, key)
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            poll = min(remaining, MAX_WAIT)
            status, body = self._request(
                "GET", "%s?wait=%.3f" % (base, poll), b"", read_timeout=poll + self._POLL_SLACK
            )
            if status == 200:
                return body
            if status != 404:
                self._expect(status, body, (200,), "GET", scope, key)
            if time.monotonic() >= deadline:
                raise TimeoutError("rendezvous key %r in scope %r not available after %.1f s" % (key, scope, wait))

    def delete_scope(self, scope: str) -> None:
        """Remove ``scope`` and all its keys (no error if absent)."""
        status, body = self._request("DELETE", _kv_path(scope), b"")
        self._expect(status, body, (204, 200), "DELETE", scope, None)

    # -- plumbing -----------------------------------------------------------

    @staticmethod
    def _expect(status: int, body: bytes, ok: Tuple[int, ...], method: str, scope: str, key: Optional[str]) -> None:
        if status in ok:
            return
        what = scope if key is None else "%s/%s" % (scope, key)
        detail = body.decode("utf-8", "replace").strip()
        raise RendezvousError("rendezvous %s %s failed: HTTP %d %s" % (method, what, status, detail), status)

    def _request(
        self, method: str, path: str, body: bytes, read_timeout: Optional[float] = None
    ) -> Tuple[int, bytes]:
        """Send one signed request; retry while the server refuses."""
        deadline = time.monotonic() + self.timeout
        delay = 0.05
        while True:
            # Sign every attempt afresh: a nonce is single-use.
            headers = _auth_headers(self._secret, method, path, body)
            headers["Content-Length"] = str(len(body))
            if body:
                headers["Content-Type"] = "application/octet-stream"
            conn = http.client.HTTPConnection(self.host, self.port, timeout=max(self.timeout, read_timeout or 0.0))
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                return response.status, response.read()
            except ConnectionRefusedError:
                if time.monotonic() + delay > deadline:
                    raise ConnectionRefusedError(
                        "rendezvous server %s:%d refused connections for "
                        "%.1f s" % (self.host, self.port, self.timeout)
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
            finally:
                conn.close()


def client_from_env(environ: Optional[Mapping[str, str]] = None, timeout: float = 30.0) -> RendezvousClient:
    """Client built from the variables the launcher gives each rank.

    Reads ``HVDLITE_RENDEZVOUS_ADDR``, ``HVDLITE_RENDEZVOUS_PORT`` and
    ``HVDLITE_SECRET`` (hex) from ``environ`` (default ``os.environ``).
    """
    env = os.environ if environ is None else environ
    try:
        addr = env["HVDLITE_RENDEZVOUS_ADDR"]
        port = int(env["HVDLITE_RENDEZVOUS_PORT"])
        secret = bytes.fromhex(env["HVDLITE_SECRET"])
    except KeyError as exc:
        raise RuntimeError("%s is not set; was this process started by an hvdlite launcher?" % exc.args[0]) from None
    return RendezvousClient(addr, port, secret, timeout=timeout)


def exchange_all(
    client: RendezvousClient, scope: str, rank: int, size: int, value: bytes, timeout: float
) -> List[bytes]:
    """All-gather of one small value per rank through the rendezvous store.

    Publishes ``value`` under key ``str(rank)`` in ``scope``, then returns
    the values of ranks ``0 .. size-1`` in rank order, waiting at most
    ``timeout`` seconds in total (raises :class:`TimeoutError`).
    """
    if size < 1 or not 0 <= rank < size:
        raise ValueError("invalid rank %d for size %d" % (rank, size))
    deadline = time.monotonic() + timeout
    client.put(scope, str(rank), value)
    values = []
    for peer in range(size):
        if peer == rank:
            values.append(bytes(value))
            continue
        remaining = max(0.0, deadline - time.monotonic())
        values.append(client.get(scope, str(peer), wait=remaining))
    return values
