"""JetStream publish round trips against a running platform, for finding stalls.

Publishes a small message every 10 ms to a stream subject and waits for each ack,
then prints p50/p99/max and how many took over 100 ms. Run it beside a load (for
example while bench/vs_vllm_server.py or a generate loop drives the engine) and
again with the machine idle, and compare.

    python bench/jetstream_latency.py [--nats-url nats://127.0.0.1:4222] [--seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import nats
from platform_up import nats_auth

SUBJECT = "ib.dlq.latency-probe"  # a stream subject every platform has (IB_DLQ)


async def probe(url: str, seconds: float) -> None:
    nc = await nats.connect(url, **nats_auth())  # the operator's, on a closed bus
    js = nc.jetstream()
    lat: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        await js.publish(SUBJECT, b"x")
        lat.append(time.perf_counter() - t)
        await asyncio.sleep(0.01)
    await nc.close()
    lat.sort()
    print(
        f"js publish n={len(lat)} p50 {lat[len(lat) // 2] * 1000:.2f} ms "
        f"p99 {lat[int(len(lat) * 0.99)] * 1000:.2f} ms max {lat[-1] * 1000:.1f} ms "
        f">100ms: {sum(x > 0.1 for x in lat)}"
    )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    p.add_argument("--seconds", type=float, default=15.0)
    a = p.parse_args()
    asyncio.run(probe(a.nats_url, a.seconds))


if __name__ == "__main__":
    main()
