"""Helpers for the tests that start real servers (dflash-serve, mpirun ranks) on 127.0.0.1."""
from __future__ import annotations

import random
import socket
import time

import httpx


def free_port() -> int:
    """A port free now and below the kernel's ephemeral range: a port the kernel hands out (bind to 0) can be
    handed out again to another socket (mpirun's own, a client's) before the server binds it seconds later."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base: str, proc, log, timeout: float = 300, poll: float = 0.2, what: str = "server") -> None:
    """Until GET {base}/health answers 200; fails with the process's log (`log()`) if it exits or times out (a
    loaded 2-core CI machine: model load plus step-cost calibration take minutes)."""
    end = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"{what} exited: {log()}"
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < end, f"server did not start: {log()}"
        time.sleep(poll)
