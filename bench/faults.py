"""The fault suite with bigger counts: `inferbus up --engine sim` under a steady load of
NATS-client and HTTP requests, each process killed with SIGKILL in turn (a worker also
stopped with SIGSTOP: worker-0-hang), then NATS, then `up` itself (SIGKILL, its
children going with it, and started again on the same state), then the state's disk
filled for 3 s and freed (the state on a 256 MiB tmpfs: root only, else skipped).

    python bench/faults.py
        [--faults sanitizer,scheduler,worker-0,worker-0-hang,gateway,nats,up,disk]
        [--nats-clients 12] [--http-clients 4] [--load-s 15] [--tokens 20] [--workers 2]
    python bench/faults.py --nats-cluster 3 --faults nats-0,nats-1,nats-2

For each fault: requests sent, served in full, ended with a retryable error, another
error, hung (no end within 20 s), duplicates (ran on two workers or ended twice),
moved (continued on another worker) with the client-visible gap of those (p50, p99),
and seconds from the kill (for up, from its start again; for the disk, from the space
coming back) to the first request sent after it that was served. The
last line is the same as one JSON object. Goal: 0 hung and 0 duplicates for every
fault; for a worker's, 0 failed and the gap p99 at most 2 s.
The harness is tests/testkit/faults.py, which tests/integration/test_faults.py runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
from pathlib import Path

import pytest
import testkit_path  # noqa: F401  (before testkit)
from testkit.faults import FAULTS, WHOLE, Platform, run_fault, table
from testkit.tmpfs import tmpfs


async def main(args: argparse.Namespace) -> None:
    faults = args.faults.split(",")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as disk:
        state = Path(tmp) / "state"
        if "disk" in faults:
            try:  # a disk of its own to fill: the platform's state on a tmpfs
                state = disk.enter_context(tmpfs(Path(tmp) / "disk", "256m")) / "state"
            except pytest.skip.Exception as why:  # not root, or no tmpfs here
                print(f"disk: skipped ({why})", flush=True)
                faults.remove("disk")
        extra = ("--schedulers", str(args.schedulers)) if args.schedulers > 1 else ()
        p = Platform(state, workers=args.workers, nats_cluster=args.nats_cluster, extra=extra)
        results = []
        try:
            for fault in faults:
                r = await run_fault(
                    p,
                    fault,
                    nats_clients=args.nats_clients,
                    http_clients=args.http_clients,
                    tokens=args.tokens,
                    load_s=args.load_s,
                )
                results.append(r)
                print(table([r]).splitlines()[-1], flush=True)
                for line in [*r.duplicate_detail[:5], *r.hung()[:5]]:
                    print(f"  {fault}: {line}", flush=True)
        finally:
            p.stop()
    print("\n" + table(results))
    print(json.dumps({"bench": "faults", "results": [r.row() for r in results]}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--faults", default=",".join(FAULTS + WHOLE))
    ap.add_argument("--nats-clients", type=int, default=12)
    ap.add_argument("--http-clients", type=int, default=4)
    ap.add_argument("--load-s", type=float, default=15.0)
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--schedulers",
        type=int,
        default=1,
        help="scheduler instances (partitioned); `--faults scheduler-1` kills the second",
    )
    ap.add_argument(
        "--nats-cluster",
        type=int,
        default=1,
        help="3: a three-node NATS; its nodes are nats-0, nats-1, nats-2",
    )
    asyncio.run(main(ap.parse_args()))
