"""One tenant's latency while others misbehave (issue 42): `inferbus up --engine sim`
(closed bus, two sim workers at 10 ms a token), a probe tenant sending one request
after another, each phase measured against the probe's own baseline in the same run:

- flood: another tenant keeps --flood-inflight requests in flight (a 3,000-request
  flood, its refusals retried at once);
- logins: --logins wrong-password CONNECTs a second for the probe tenant's user;
- connections: another tenant opens --hog connections (its account takes 256) and
  keeps trying more, the probe connecting afresh for each request (its baseline too);
- idle: --idle idle TCP connections held open to the gateway, the probe on HTTP with
  a fresh connection per request (its baseline on HTTP too).

    python bench/isolation.py [--phase-s 15] [--tokens 8] [--flood 3000]
        [--flood-inflight 200] [--logins 50] [--hog 1000] [--idle 5000]

Prints, per phase, the probe's requests, its errors and refusals, its p50 and p95 and
the ratio of its p50 to its baseline's; the last line is the same as JSON. Goal: each
ratio at most 1.2, no probe request refused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
import testkit_path  # noqa: F401  (before testkit)
from testkit.faults import MODEL, Platform

from inferbus.client import Client, RequestError
from inferbus.shared.bus import BusAuthError, BusUnreachableError, connect
from inferbus.shared.buscreds import BusCredentials, load_credentials


async def probe_nats(client: Client, tokens: int, until: float) -> tuple[list[float], int]:
    took, errors = [], 0
    while time.monotonic() < until:
        began = time.monotonic()
        try:
            await client.generate(MODEL, f"probe {uuid.uuid4().hex[:6]}", max_tokens=tokens)
            took.append(time.monotonic() - began)
        except RequestError:
            errors += 1
    return took, errors


async def probe_http(base: str, tokens: int, until: float) -> tuple[list[float], int]:
    took, errors = [], 0
    body = {"model": MODEL, "max_tokens": tokens, "messages": [{"role": "user", "content": "p"}]}
    while time.monotonic() < until:
        began = time.monotonic()
        try:  # a fresh connection each: it must get in past the cap
            async with aiohttp.ClientSession(
                base, connector=aiohttp.TCPConnector(force_close=True)
            ) as http:
                async with http.post("/v1/chat/completions", json=body) as r:
                    await r.read()
                    ok = r.status == 200
        except aiohttp.ClientError:
            ok = False
        if ok:
            took.append(time.monotonic() - began)
        else:
            errors += 1
            await asyncio.sleep(0.05)
    return took, errors


async def flood(p: Platform, creds: str, total: int, inflight: int, until: float) -> int:
    client = await Client.connect(p.nats_url, "flood", creds=creds)
    sent = 0

    async def one() -> None:
        nonlocal sent
        while sent < total and time.monotonic() < until:
            sent += 1
            try:
                await client.generate(MODEL, f"flood {sent}", max_tokens=8, timeout=60)
            except RequestError:
                pass

    await asyncio.gather(*(one() for _ in range(inflight)))
    await client.close()
    return sent


async def failed_logins(p: Platform, user: str, per_s: float, until: float) -> int:
    wrong = BusCredentials(user=user, password="not-the-password")
    tries = 0

    async def one() -> None:
        try:
            nc = await connect(p.nats_url, "wrong", wrong, give_up_s=5)
            await nc.close()
        except (BusAuthError, Exception):
            pass

    pending: set[asyncio.Task[None]] = set()
    while time.monotonic() < until:
        task = asyncio.create_task(one())
        pending.add(task)
        task.add_done_callback(pending.discard)
        tries += 1
        await asyncio.sleep(1 / per_s)
    await asyncio.gather(*pending, return_exceptions=True)
    return tries


async def probe_fresh(
    p: Platform, creds: str, tokens: int, until: float
) -> tuple[list[float], int]:
    """A request on a connection of its own: the connect is part of what it waits."""
    took, errors = [], 0
    while time.monotonic() < until:
        began = time.monotonic()
        try:
            client = await Client.connect(p.nats_url, "probe-fresh", creds=creds)
            try:
                await client.generate(MODEL, f"probe {uuid.uuid4().hex[:6]}", max_tokens=tokens)
            finally:
                await client.close()
            took.append(time.monotonic() - began)
        except (RequestError, BusAuthError):
            errors += 1
    return took, errors


async def hog_connections(p: Platform, creds: str, n: int, until: float) -> tuple[int, int]:
    """Up to ``n`` connections held, then one more tried every 20 ms: (held, refused)."""
    who = load_credentials(creds)
    held, refused = [], 0

    async def one(i: int) -> None:
        nonlocal refused
        try:
            held.append(await connect(p.nats_url, f"hog-{i}", who, give_up_s=5))
        except (BusAuthError, BusUnreachableError):
            refused += 1

    await asyncio.gather(*(one(i) for i in range(n)))
    while time.monotonic() < until:
        await one(n)
        await asyncio.sleep(0.02)
    for nc in held:
        await nc.close()
    return len(held), refused


def hold_idle(port: int, n: int) -> list[socket.socket]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n + 1024)), hard))
    held = []
    for _ in range(n):
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            break
    return held


def summary(name: str, took: list[float], errors: int, base: float | None) -> dict[str, object]:
    p50 = statistics.median(took) if took else float("nan")
    p95 = sorted(took)[int(0.95 * (len(took) - 1))] if took else float("nan")
    return {
        "phase": name,
        "requests": len(took) + errors,
        "errors": errors,
        "p50_ms": round(p50 * 1000, 1),
        "p95_ms": round(p95 * 1000, 1),
        "ratio": round(p50 / base, 2) if base else 1.0,
    }


async def main(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        p = Platform(state)
        try:
            made = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "inferbus.cli", "creds", "new", "--tenant", "flood",
                 "--state-dir", str(state), "--nats-url", p.nats_url],
                capture_output=True, text=True,
                env={**os.environ, "INFERBUS_NATS_CREDS": str(p.operator)},
            )  # fmt: skip
            assert made.returncode == 0, made.stderr
            flood_creds = made.stdout.strip()
            probe_user = load_credentials(p.tenant).user
            client = await Client.connect(p.nats_url, "probe", creds=p.tenant)
            await probe_nats(client, a.tokens, time.monotonic() + 3)  # warm
            rows = []
            until = time.monotonic() + a.phase_s
            took, err = await probe_nats(client, a.tokens, until)
            base = statistics.median(took)
            rows.append(summary("nats baseline", took, err, None))
            until = time.monotonic() + a.phase_s
            (took, err), sent = await asyncio.gather(
                probe_nats(client, a.tokens, until),
                flood(p, flood_creds, a.flood, a.flood_inflight, until),
            )
            rows.append(summary(f"flood ({sent} sent)", took, err, base))
            until = time.monotonic() + a.phase_s
            (took, err), tries = await asyncio.gather(
                probe_nats(client, a.tokens, until),
                failed_logins(p, probe_user, a.logins, until),
            )
            rows.append(summary(f"logins ({tries / a.phase_s:.0f}/s)", took, err, base))
            await client.close()
            until = time.monotonic() + a.phase_s
            took, err = await probe_fresh(p, p.tenant, a.tokens, until)
            fresh_base = statistics.median(took)
            rows.append(summary("fresh-conn baseline", took, err, None))
            until = time.monotonic() + a.phase_s
            (took, err), (held_n, refused) = await asyncio.gather(
                probe_fresh(p, p.tenant, a.tokens, until),
                hog_connections(p, flood_creds, a.hog, until),
            )
            rows.append(summary(f"conns ({held_n} held, {refused} refused)", took, err, fresh_base))
            until = time.monotonic() + a.phase_s
            took, err = await probe_http(p.http, a.tokens, until)
            http_base = statistics.median(took)
            rows.append(summary("http baseline", took, err, None))
            held = await asyncio.to_thread(hold_idle, p.port, a.idle)
            until = time.monotonic() + a.phase_s
            took, err = await probe_http(p.http, a.tokens, until)
            rows.append(summary(f"idle ({len(held)} held)", took, err, http_base))
            for s in held:
                s.close()
        finally:
            p.stop()
    cols = ["phase", "requests", "errors", "p50_ms", "p95_ms", "ratio"]
    widths = [34] + [10] * (len(cols) - 1)
    print(" ".join(f"{c:>{w}}" for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print(" ".join(f"{r[c]!s:>{w}}" for c, w in zip(cols, widths, strict=True)))
    print(json.dumps({"bench": "isolation", "results": rows}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--phase-s", type=float, default=15.0)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--flood", type=int, default=3000)
    ap.add_argument("--flood-inflight", type=int, default=200)
    ap.add_argument("--logins", type=float, default=50.0)
    ap.add_argument("--hog", type=int, default=1000)
    ap.add_argument("--idle", type=int, default=5000)
    asyncio.run(main(ap.parse_args()))
