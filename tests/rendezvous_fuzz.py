"""Mutation fuzzing of the rendezvous service's request handling, in memory: millions of inputs in minutes.

Each input is a byte string handed to the service's real request handler (``hvdlite.common.rendezvous._Handler``,
HTTP parsing, body reading, authentication, routing, the store) through a socket stand-in, so no connection is
made and the cost is the parsing itself. Inputs are correctly signed PUT, GET and DELETE requests (regenerated
every 1,000 inputs, so timestamps stay inside the accepted window) and mutations of them: bit flips, random and
"interesting" bytes, insertions, deletions, duplicated and cut ranges, splices of two requests, and plain noise.

Checked for every input: the handler returns and logs no unexpected exception (it contains them, to keep
serving, so the check listens to its logger), the answer is empty (connection closed) or an HTTP/1.x status line
whose status is below 500, or 501 (unknown method) or 505 (unknown HTTP version), the right answers there, and
the store only ever holds values that some correctly signed PUT carried to that scope and key: no mutation can
forge content.

    python tests/rendezvous_fuzz.py --count 1000000 --seed 7     # the long run quoted in docs/faults.md

``tests/test_rendezvous.py`` runs a short one in CI.
"""

from __future__ import annotations

import argparse
import io
import logging
import random
import secrets
import time
from typing import List, Set, Tuple

from hvdlite.common import rendezvous

SECRET = b"fuzz-secret-0123456789abcdef"
INTERESTING = [
    b"\x00",
    b"\xff",
    b"\r\n",
    b"\r\n\r\n",
    b":",
    b" ",
    b"%",
    b"%ff",
    b"/",
    b"?",
    b"-1",
    b"0",
    b"99999999999999999999",
    b"\x7f",
    "é".encode(),
    b"Content-Length: ",
    b"Transfer-Encoding: chunked",
]


class _FakeSocket:
    """What the handler needs of a connected socket: a reader over the input, and somewhere to write."""

    def __init__(self, payload: bytes):
        self.payload = payload
        self.written = bytearray()

    def settimeout(self, _timeout) -> None:
        pass

    def setsockopt(self, *_args) -> None:
        pass

    def makefile(self, mode: str, *_args):
        assert "r" in mode
        return io.BufferedReader(io.BytesIO(self.payload))

    def sendall(self, data) -> None:
        self.written += data


class _Server:
    """The attributes of the HTTP server the handler reads."""

    def __init__(self):
        self.secret = SECRET
        self.store = rendezvous._Store()


def _signed(method: str, path: str, body: bytes) -> bytes:
    timestamp = "%.6f" % time.time()
    nonce = secrets.token_hex(16)
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: rendezvous",
        f"Content-Length: {len(body)}",
        f"{rendezvous.HEADER_TIMESTAMP}: {timestamp}",
        f"{rendezvous.HEADER_NONCE}: {nonce}",
        f"{rendezvous.HEADER_AUTH}: {rendezvous.sign_request(SECRET, method, path, timestamp, nonce, body)}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _corpus(rng: random.Random) -> Tuple[List[bytes], Set[Tuple[str, str, bytes]]]:
    """Fresh signed requests, and the (scope, key, value) triples their PUTs may store."""
    requests, allowed = [], set()
    for _ in range(24):
        scope, key = "s%d" % rng.randrange(4), "k%d" % rng.randrange(4)
        body = rng.randbytes(rng.randrange(0, 40))
        kind = rng.randrange(3)
        if kind == 0:
            requests.append(_signed("PUT", f"/kv/{scope}/{key}", body))
            allowed.add((scope, key, body))
        elif kind == 1:
            requests.append(_signed("GET", f"/kv/{scope}/{key}", b""))
        else:
            requests.append(_signed("DELETE", f"/kv/{scope}", b""))
    return requests, allowed


def mutate(rng: random.Random, data: bytes, corpus: List[bytes]) -> bytes:
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3, 6))):
        if not out:
            out += rng.randbytes(rng.randrange(1, 16))
            continue
        at = rng.randrange(len(out))
        kind = rng.randrange(8)
        if kind == 0:
            out[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            out[at] = rng.randrange(256)
        elif kind == 2:
            out[at:at] = rng.choice(INTERESTING)
        elif kind == 3:
            del out[at : at + rng.randrange(1, 32)]
        elif kind == 4:
            end = min(len(out), at + rng.randrange(1, 64))
            out[at:at] = out[at:end]
        elif kind == 5:
            del out[at:]
        elif kind == 6:
            other = rng.choice(corpus)
            cut = rng.randrange(len(other) + 1)
            out = out[:at] + bytearray(other[cut:])
        else:
            out[at:at] = rng.randbytes(rng.randrange(1, 16))
    return bytes(out)


class _Unexpected(logging.Handler):
    """Collects what the handler logs at ERROR and above: exceptions it contained."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: List[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def check_one(server: _Server, payload: bytes, unexpected: _Unexpected) -> int:
    """Runs one input through the handler; returns the status (0 when it closed without answering)."""
    sock = _FakeSocket(payload)
    rendezvous._Handler(sock, ("fuzz", 0), server)
    assert not unexpected.records, (
        payload,
        [r.getMessage() for r in unexpected.records],
        unexpected.records[0].exc_info,
    )
    answer = bytes(sock.written)
    if not answer:
        return 0
    assert answer.startswith(b"HTTP/1."), (payload, answer[:80])
    status = int(answer.split(b" ", 2)[1])
    assert status < 500 or status in (501, 505), (payload, answer[:200])
    return status


def run(count: int, seed: int) -> dict:
    rng = random.Random(seed)
    server = _Server()
    unexpected = _Unexpected()
    rendezvous.logger.addHandler(unexpected)
    try:
        return _run(rng, server, unexpected, count, seed)
    finally:
        rendezvous.logger.removeHandler(unexpected)


def _run(rng: random.Random, server: _Server, unexpected: _Unexpected, count: int, seed: int) -> dict:
    statuses: dict = {}
    allowed: Set[Tuple[str, str, bytes]] = set()
    corpus: List[bytes] = []
    for i in range(count):
        if i % 1000 == 0:
            corpus, fresh = _corpus(rng)
            allowed |= fresh
        choice = rng.randrange(20)
        if choice == 0:
            payload = rng.choice(corpus)  # as signed: its PUT may store, its replay must be refused
        elif choice == 1:
            payload = rng.randbytes(rng.randrange(0, 300))
        else:
            payload = mutate(rng, rng.choice(corpus), corpus)
        status = check_one(server, payload, unexpected)
        statuses[status] = statuses.get(status, 0) + 1
        if i % 997 == 0:
            for scope, values in server.store.snapshot().items():
                for key, value in values.items():
                    assert (scope, key, value) in allowed, ("forged", scope, key, value)
    return {"inputs": count, "seed": seed, "statuses": dict(sorted(statuses.items()))}


def main() -> None:
    parser = argparse.ArgumentParser(description="fuzz the rendezvous request handler in memory")
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    start = time.monotonic()
    result = run(args.count, args.seed)
    print(result, "in %.1f s" % (time.monotonic() - start))


if __name__ == "__main__":
    main()
