"""Which data path the shared KV tier's blocks want: the JetStream Object Store (the
bus) against files in a shared folder (what the tier uses), same blocks, same disk.

A bundled nats-server with its store on the same disk as the folder. For each block
size (a tiny-model block, and a 1B-class model's 128-token block: 16 layers x 2 x 8
KV heads x 64 x 2 bytes x 128 = 4 MiB), N blocks are written both ways, then read
back: page cache dropped before each read where allowed (root), else warm for both.

    python bench/kvspill_transport.py [--sizes 65536,4194304] [--blocks 64]

Prints MB/s each way and the ratio object store / files.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import nats
from kvspill import drop_caches

from inferbus.shared.kvblocks import block_path, decode_block, encode_block
from inferbus.shared.natsserver import NatsServer


async def run(url: str, root: Path, size: int, n: int) -> dict[str, float]:
    payloads = [os.urandom(size) for _ in range(n)]
    keys = [f"ns:{i:064x}" for i in range(n)]
    nc = await nats.connect(url)
    js = nc.jetstream()
    bucket = f"kvbench-{size}"
    store = await js.create_object_store(bucket)
    out: dict[str, float] = {}

    start = time.perf_counter()
    for key, p in zip(keys, payloads, strict=True):
        await store.put(key.replace(":", "-"), encode_block(key, p))
    out["objstore_put"] = size * n / (time.perf_counter() - start)
    start = time.perf_counter()
    for key, p in zip(keys, payloads, strict=True):
        path = block_path(root, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(encode_block(key, p))
        os.replace(tmp, path)
    out["file_write"] = size * n / (time.perf_counter() - start)

    cold = drop_caches()
    start = time.perf_counter()
    for key in keys:
        got = await store.get(key.replace(":", "-"))
        decode_block(key, got.data or b"", size)
    out["objstore_get"] = size * n / (time.perf_counter() - start)
    drop_caches()
    start = time.perf_counter()
    for key in keys:
        decode_block(key, block_path(root, key).read_bytes(), size)
    out["file_read"] = size * n / (time.perf_counter() - start)
    out["cold"] = float(cold)
    await js.delete_object_store(bucket)
    await nc.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="65536,4194304")
    ap.add_argument("--blocks", type=int, default=64)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="inferbus-kvtransport-"))
    server = NatsServer(work / "nats").start()
    try:
        print(
            f"{'block':>9} | {'objstore put':>12} {'file write':>11} | "
            f"{'objstore get':>12} {'file read':>10} | {'get / read':>10}"
        )
        for size in map(int, args.sizes.split(",")):
            r = asyncio.run(run(server.url, work / "files", size, args.blocks))
            mb = 1e6
            print(
                f"{size:>9} | {r['objstore_put'] / mb:>10.0f}MB {r['file_write'] / mb:>9.0f}MB"
                f" | {r['objstore_get'] / mb:>10.0f}MB {r['file_read'] / mb:>8.0f}MB"
                f" | {r['objstore_get'] / r['file_read']:>10.3f}"
            )
        print("reads:", "cold (page cache dropped)" if r["cold"] else "warm (page cache)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
