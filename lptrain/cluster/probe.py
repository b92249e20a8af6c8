"""One node's part of the fidelity check: send raw TCP to one peer while receiving from another.

``python -m lptrain.cluster.probe --to ADDRESS`` runs inside a node's namespace
(``lptrain.cluster.fidelity`` starts one on every node). It listens on ``--port``,
connects to the same port at ``--to``, accepts the one connection coming in, and says
``ready``. Then it waits for ``go START WARMUP SECONDS`` on its standard input (times on
the monotonic clock, which every namespace shares), sends as fast as TCP lets it from
START until the window ends, and counts what arrives. It prints one JSON line: the bytes
received between the first and the last read inside the window ``[START + WARMUP, START +
WARMUP + SECONDS]``, the time between those reads, so that the rate is exact whatever the
size of each read, and every byte of the reads inside the window (``window_bytes``), so that
flows taking turns on one link can be counted together over the window.

Plain sockets and no torch: the check measures what the host's network stack carries, and
starts in a fraction of a second on every node.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time

CHUNK = 1 << 20  # bytes per send and per read
TAIL_S = 0.2  # the sender goes on this long past the window, so no receiver's window runs dry


def _connect(address: str, port: int, deadline: float) -> socket.socket:
    """Connect to the peer's probe, retrying while it has not started listening yet."""
    while True:
        try:
            return socket.create_connection((address, port), timeout=max(0.1, deadline - time.monotonic()))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _send(conn: socket.socket, start: float, end: float) -> None:
    payload = bytes(CHUNK)
    time.sleep(max(0.0, start - time.monotonic()))
    try:
        while time.monotonic() < end:
            conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the receiver has gone: what it counted is what it got


def receive(conn: socket.socket, window: tuple[float, float], stop: float) -> dict:
    """Read until the peer stops sending (or ``stop``); the bytes and times of the window's reads."""
    buffer = bytearray(CHUNK)
    total, first, last, before = 0, None, None, 0
    while time.monotonic() < stop:
        try:
            n = conn.recv_into(buffer)
        except TimeoutError:
            break
        now = time.monotonic()
        if n == 0:
            break
        total += n
        if window[0] <= now <= window[1]:
            if first is None:
                first, before = (now, total), total - n
            last = (now, total)
    inside = last[1] - before if last is not None else 0
    if first is None or last is None or last[0] <= first[0]:
        return {"bytes": 0, "seconds": 0.0, "window_bytes": inside}
    return {"bytes": last[1] - first[1], "seconds": last[0] - first[0], "window_bytes": inside}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lptrain.cluster.probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--to", required=True, help="the address of the node this one sends to")
    parser.add_argument("--port", type=int, default=29400)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to give up after")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    listener = socket.create_server(("", args.port), reuse_port=False)
    listener.settimeout(args.timeout)
    incoming: list[socket.socket] = []
    accepting = threading.Thread(target=lambda: incoming.append(listener.accept()[0]), daemon=True)
    accepting.start()
    outgoing = _connect(args.to, args.port, deadline)
    accepting.join(max(0.0, deadline - time.monotonic()))
    if not incoming:
        sys.exit(f"probe: no peer connected to port {args.port} within {args.timeout:g} s")
    print("ready", flush=True)
    words = sys.stdin.readline().split()
    if len(words) != 4 or words[0] != "go":
        sys.exit(f"probe: expected 'go START WARMUP SECONDS', got {' '.join(words)!r}")
    start, warmup, seconds = map(float, words[1:])
    window = (start + warmup, start + warmup + seconds)
    conn = incoming[0]
    conn.settimeout(max(1.0, window[1] + args.timeout - time.monotonic()))
    outgoing.settimeout(conn.gettimeout())
    sender = threading.Thread(target=_send, args=(outgoing, start, window[1] + TAIL_S), daemon=True)
    sender.start()
    result = receive(conn, window, stop=window[1] + TAIL_S + args.timeout)
    sender.join(args.timeout)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
