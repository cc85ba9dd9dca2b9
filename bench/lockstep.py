"""Two independent training processes that wait for each other after every step, as a synchronous
data-parallel library makes its ranks do, but with the least a barrier can cost: one byte each way over a local
TCP socket, no gradients. The training benchmarks run it beside the fully independent pair, so that what the wait
alone costs on the machine is told apart from what the library costs."""

import os
import socket
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environments(env: dict) -> list:
    """The two processes' environments: LOCKSTEP_PORT, and LOCKSTEP_INDEX (0 listens, 1 connects)."""
    port = str(free_port())
    return [dict(env, LOCKSTEP_PORT=port, LOCKSTEP_INDEX=str(i)) for i in range(2)]


def peer_barrier():
    """Connects to the other process (environments()); returns a function that waits for it."""
    port, index = int(os.environ["LOCKSTEP_PORT"]), int(os.environ["LOCKSTEP_INDEX"])
    if index == 0:
        with socket.create_server(("127.0.0.1", port)) as server:
            peer, _ = server.accept()
    else:
        deadline = time.monotonic() + 120
        while True:
            try:
                peer = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def wait_for_peer():
        peer.sendall(b"s")
        if peer.recv(1) != b"s":
            raise RuntimeError("the lockstep peer left")

    return wait_for_peer
