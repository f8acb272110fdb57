"""What one message costs the process that reads it, before any of the platform's own
work: the floor under every hop of the token path (issue 40).

    python bench/bus_wakeup.py [--rates 200,1000] [--size 4700] [--seconds 8]

For each rate, a sender writes ``--size``-byte messages at that rate for
``--seconds``, to a reader in another process that does nothing with them:

- ``raw``: a uvloop ``asyncio.Protocol`` on one end of a socket pair (the event
  loop's wakeup and a read: what any asyncio reader pays);
- ``nats``: a nats-py subscriber with an empty callback, on a real nats-server (the
  platform's readers: the client's parser, its queue and the subscription's task).

Printed: the reader's CPU (user + system) per message for each, the rate the sender
reached (below the one asked: each write also takes time), and the ratio. At an
engine step's rate (a few hundred a second) a message wakes the reader by itself; at
higher rates reads gather several. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import tempfile
import time
from pathlib import Path

import nats
import uvloop

from inferbus.shared.natsserver import NatsServer


def _cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _send(write, rate: int, seconds: float, size: int) -> float:
    """Writes at about ``rate`` a second; returns the rate it reached."""
    data = b"x" * (size - 1) + b"\n"
    t0, n = time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        write(data)
        n += 1
        time.sleep(1 / rate)
    return n / (time.monotonic() - t0)


def _child(run, w: int) -> None:
    """Runs ``run`` in the forked reader and leaves without unwinding into the
    parent's code (its ``finally`` would stop the shared nats-server)."""
    code = 1
    try:
        run()
        code = 0
    finally:
        os.close(w)
        os._exit(code)


def _result(pid: int, r: int) -> float:
    _, status = os.waitpid(pid, 0)
    data = os.read(r, 64)
    os.close(r)
    if status != 0 or not data:
        raise RuntimeError("the reader failed")
    return float(data)


def raw(rate: int, seconds: float, size: int) -> tuple[float, float]:
    """CPU µs per message of a uvloop protocol reading a socket pair, and the rate."""
    a, b = socket.socketpair()
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        a.close()
        os.close(r)
        os.close(ready_r)

        async def read() -> None:
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            n = 0

            class Reader(asyncio.Protocol):
                def data_received(self, data: bytes) -> None:
                    nonlocal n
                    n += data.count(b"\n")

                def connection_lost(self, exc: Exception | None) -> None:
                    done.set_result(None)

            await loop.connect_accepted_socket(Reader, b)
            c0 = _cpu()
            os.write(ready_w, b"r")
            await done
            os.write(w, json.dumps((_cpu() - c0) / max(n, 1) * 1e6).encode())

        _child(lambda: uvloop.run(read()), w)
    b.close()
    os.close(w)
    os.close(ready_w)
    os.read(ready_r, 1)
    os.close(ready_r)
    reached = _send(a.sendall, rate, seconds, size)
    a.close()
    return _result(pid, r), reached


def bare_nats(url: str, rate: int, seconds: float, size: int) -> tuple[float, float]:
    """CPU µs per message of a nats-py subscriber doing nothing, and the rate."""
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.close(ready_r)

        async def read() -> None:
            nc = await nats.connect(url)
            n = 0

            async def on(msg) -> None:
                nonlocal n
                n += 1

            await nc.subscribe("wake.>", cb=on)
            await nc.flush()
            c0 = _cpu()
            os.write(ready_w, b"r")
            await asyncio.sleep(seconds + 1.0)
            os.write(w, json.dumps((_cpu() - c0) / max(n, 1) * 1e6).encode())
            await nc.close()

        _child(lambda: uvloop.run(read()), w)
    os.close(w)
    os.close(ready_w)
    if not os.read(ready_r, 1):
        os.close(ready_r)
        raise RuntimeError("the reader failed to subscribe")
    os.close(ready_r)
    reached = [0.0]

    async def send() -> None:
        nc = await nats.connect(url)
        data = b"x" * size
        t0, k = time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            await nc.publish(f"wake.{k % 16}", data)
            k += 1
            await asyncio.sleep(1 / rate)
        reached[0] = k / (time.monotonic() - t0)
        await nc.flush()
        await nc.close()

    uvloop.run(send())
    return _result(pid, r), reached[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="200,1000", help="messages a second, comma-separated")
    p.add_argument("--size", type=int, default=4700, help="bytes a message (a step's batch)")
    p.add_argument("--seconds", type=float, default=8.0)
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats").start()
        try:
            for rate in (int(x) for x in a.rates.split(",")):
                r, r_rate = raw(rate, a.seconds, a.size)
                n, n_rate = bare_nats(server.url, rate, a.seconds, a.size)
                rows.append(
                    {
                        "rate": rate,
                        "raw_us": round(r, 1),
                        "raw_rate": round(r_rate),
                        "nats_us": round(n, 1),
                        "nats_rate": round(n_rate),
                    }
                )
                print(
                    f"{rate:6d}/s asked: raw uvloop {r:6.1f} µs a message ({r_rate:.0f}/s)   "
                    f"nats-py {n:6.1f} µs ({n_rate:.0f}/s)   ratio {n / r:.2f}"
                )
        finally:
            server.stop()
    print(json.dumps({"bench": "bus_wakeup", "size": a.size, "rows": rows}))


if __name__ == "__main__":
    main()
