"""Attacks on a running hvdlite-run job: strangers talk to its rendezvous service and to a rank's data-plane
listener while the job is starting. Every one must be rejected, and the job must still complete.

The test learns where to aim from the job's own output: ``--verbose`` prints the rendezvous address, and
``--log-level info`` makes each rank print its listener address. Rank 1 waits for a file the test creates
after the attacks, so rank 0 sits in its bootstrap (listener open, waiting for rank 1) during them.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import os
import re
import socket
import struct
import sys
import threading
import time

import pytest
from launcher_helpers import LiveJob, write_script

from hvdlite.common.rendezvous import RendezvousClient, RendezvousError

SCRIPT = """
import os, sys, time
import torch
import hvdlite.torch as hvd

if os.environ["HVDLITE_RANK"] == "1":
    deadline = time.monotonic() + 40
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.05)
hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
gathered = hvd.allgather(torch.tensor([hvd.rank()]))
assert total.item() == 3.0 and gathered.tolist() == [0, 1], (total, gathered)
print("OK", hvd.rank(), flush=True)
"""

MAGIC = b"HVDLITE1"


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _closed_without_answer(sock: socket.socket) -> bool:
    """True if the listener closes the connection without sending anything more."""
    try:
        return sock.recv(64) == b""
    except ConnectionResetError:
        return True


def attack_listener_with_garbage(address, results):
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(os.urandom(60))  # the size of a handshake reply, but noise
        hello = _recv_exactly(sock, 24)
        results["garbage"] = hello[:8] == MAGIC and _closed_without_answer(sock)


def attack_listener_with_wrong_secret(address, results):
    """A well-formed handshake (handshake.h) claiming to be rank 1, with a MAC made with the wrong secret."""
    with socket.create_connection(address, timeout=30) as sock:
        hello = _recv_exactly(sock, 24)
        assert hello[:8] == MAGIC, hello
        server_nonce, client_nonce, rank = hello[8:], os.urandom(16), struct.pack("<i", 1)
        job_id = b"guessed-job.0"
        mac = hmac.new(
            b"not the job secret" * 2, b"client" + job_id + server_nonce + client_nonce + rank, hashlib.sha256
        ).digest()
        sock.sendall(MAGIC + rank + client_nonce + mac)
        results["wrong_secret"] = _closed_without_answer(sock)


def attack_listener_by_hanging_up(address, results):
    with socket.create_connection(address, timeout=30):
        pass
    results["hang_up"] = True


def attack_rendezvous(host: str, port: int) -> None:
    # No credentials at all.
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", "/kv/init.x.0/0")
    assert conn.getresponse().status == 403
    conn.close()
    # Valid-looking requests signed with the wrong secret, reading and writing.
    stranger = RendezvousClient(host, port, b"wrong secret" * 3, timeout=10)
    for action in (lambda: stranger.get("anything", "0", wait=0), lambda: stranger.put("init.x.0", "1", b"evil")):
        with pytest.raises(RendezvousError) as info:
            action()
        assert info.value.status == 403
    # Garbage bytes, then a truncated request: the service answers 400 or hangs up, and keeps serving.
    for payload in (os.urandom(300) + b"\r\n\r\n", b"PUT /kv/a/b HTTP/1.1\r\nContent-Length: 99\r\n\r\nshort"):
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            reply = sock.recv(400)
            # A request line it cannot parse gets an HTTP/0.9-style error page without a status line.
            assert reply == b"" or re.search(rb"(HTTP/1\.. |Error code: )4\d\d", reply), reply


@pytest.mark.timeout(90)
def test_strangers_are_rejected_and_the_job_completes(tmp_path):
    go = tmp_path / "go"
    script = write_script(tmp_path, SCRIPT)
    job = LiveJob(
        ["-np", "2", "--verbose", "--log-level", "info", "--start-timeout", "40", sys.executable, script, str(go)]
    )
    try:
        line = job.wait_for(lambda text: "rendezvous service at" in text)[0]
        rdv_host, rdv_port = re.search(r"rendezvous service at ([\d.]+):(\d+)", line).groups()
        line = job.wait_for(lambda text: text.startswith("[0]<stderr>:") and "data-plane listener at" in text)[0]
        host, port = re.search(r"data-plane listener at ([\d.]+):(\d+)", line).groups()
        listener = (host, int(port))

        attack_rendezvous(rdv_host, int(rdv_port))
        results = {}
        threads = [
            threading.Thread(target=attack, args=(listener, results), daemon=True)
            for attack in (
                attack_listener_with_garbage,
                attack_listener_with_wrong_secret,
                attack_listener_by_hanging_up,
            )
        ]
        # Two strangers connect first and never say a word. Handshakes run concurrently, so they cannot hold up
        # rank 1 for their 5-second handshake deadlines (serially that would be 10 s or more).
        silent = [socket.create_connection(listener, timeout=10) for _ in range(2)]
        for thread in threads:
            thread.start()
        # The listener answers once rank 0 has everyone's address: let rank 1 start now.
        started = time.monotonic()
        go.write_text("go")
        for thread in threads:
            thread.join(timeout=40)
        code = job.finish(timeout=60)
        elapsed = time.monotonic() - started
    finally:
        job.close()
        for sock in locals().get("silent", []):
            sock.close()
    assert elapsed < 8.0, f"silent connections delayed the job: {elapsed:.1f} s"
    output = job.output()
    assert code == 0, output
    assert results == {"garbage": True, "wrong_secret": True, "hang_up": True}, (results, output)
    for rank in (0, 1):
        assert "[%d]<stdout>: OK %d\n" % (rank, rank) in job.stdout, output
    # Rank 0's core says why it dropped each stranger. The wrong secret's verdict races rank 1: rank 0 hears the
    # stranger only once it has every rank's address, and cuts the handshakes still running short when rank 1 has
    # connected, which it says so. The verdict itself is checked without the race in the core's unit tests.
    rejected = [text for text in job.stderr if text.startswith("[0]<stderr>:") and "rejected a connection" in text]
    assert len(rejected) >= 2, output
    assert any(
        "failed authentication (wrong job secret)" in text or "cut short: every rank had connected" in text
        for text in rejected
    ), output
    assert any("did not speak hvdlite" in text for text in rejected), output
