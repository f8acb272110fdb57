"""The Kubernetes NATS StatefulSet's configuration, run for real without a cluster: three
containers of the image, each with the ConfigMap's nats.conf and the files of the
Secret `inferbus creds k8s` makes, named as the StatefulSet's pods are
(nats-N.nats-cluster) on a Docker network. They must form one JetStream cluster that
holds a three-replica stream, take a service's credentials and refuse a client with none.

Needs a Docker engine and the image (CI: scripts/docker-setup.sh, scripts/docker-build.sh);
skipped, saying which is missing, elsewhere."""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest
import yaml
from testkit.containers import docker_missing

from inferbus.k8sbus import NATS_PEERS, bus_secrets

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "inferbus:cpu"
NODES = 3

CHECK = """
import asyncio, json, sys, urllib.request
import nats
import nats.errors, nats.js.errors
from nats.js.api import StreamConfig

def creds(name):
    return json.load(open(f"/creds/{name}.json"))

async def main():
    # JetStream's meta group: every node a peer, one leader
    for _ in range(120):
        try:
            jsz = json.load(urllib.request.urlopen("http://nats-0.nats-cluster:8222/jsz"))
            meta = jsz.get("meta_cluster", {})
            if meta.get("cluster_size") == 3 and meta.get("leader"):
                break
        except OSError:
            pass
        await asyncio.sleep(0.5)
    else:
        sys.exit(f"no JetStream cluster of 3 formed: {jsz.get('meta_cluster')}")
    out = {"leader": meta["leader"]}
    op = creds("operator")
    nc = await nats.connect("nats://nats:4222", user=op["user"], password=op["password"])
    js = nc.jetstream()
    # a leader just elected may not yet count every node as a peer: it refuses the
    # placement until then (err 10005), as the platform's provisioner is told too
    for _ in range(120):
        try:
            info = await js.add_stream(StreamConfig(name="R3CHECK", subjects=["r3check.>"],
                                                    num_replicas=3))
            break
        except nats.js.errors.APIError as exc:
            if exc.err_code != 10005:
                raise
            await asyncio.sleep(0.5)
    else:
        sys.exit("the cluster never placed a 3-replica stream")
    out["replicas"] = info.config.num_replicas
    # a new replicated stream answers only once its own leader is elected, which can
    # follow add_stream's reply by a moment on a loaded machine
    for _ in range(60):
        try:
            await js.publish("r3check.one", b"x", timeout=2)
            break
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError,
                nats.js.errors.NoStreamResponseError):
            await asyncio.sleep(0.5)
    else:
        sys.exit("the R3 stream never took a message")
    out["messages"] = (await js.stream_info("R3CHECK")).state.messages
    await js.delete_stream("R3CHECK")
    await nc.close()
    svc = creds("pods-scheduler")
    nc = await nats.connect("nats://nats-2.nats-cluster:4222", user=svc["user"],
                            password=svc["password"], inbox_prefix="_INBOX." + svc["user"])
    out["service_connected"] = nc.is_connected
    await nc.close()
    try:
        await nats.connect("nats://nats-1.nats-cluster:4222", allow_reconnect=False,
                           connect_timeout=3, max_reconnect_attempts=0)
        out["anonymous"] = "accepted"
    except Exception as exc:
        out["anonymous"] = "refused: " + type(exc).__name__
    print(json.dumps(out))

asyncio.run(main())
"""


def docker(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"docker {' '.join(args[:3])}: {done.stderr[-2000:]}"
    return done.stdout


def test_the_statefulsets_nodes_form_a_closed_jetstream_cluster(tmp_path):
    missing = docker_missing(IMAGE)
    if missing:
        pytest.skip(missing)
    listing = bus_secrets(tmp_path / "auth", NODES)
    auth = next(s for s in listing["items"] if s["metadata"]["name"] == "inferbus-nats-auth")
    manifests = [
        o for o in yaml.safe_load_all((ROOT / "deploy/k8s/base/nats.yaml").read_text()) if o
    ]
    config_map = next(o for o in manifests if o["kind"] == "ConfigMap")
    statefulset = next(o for o in manifests if o["kind"] == "StatefulSet")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    command = container["command"]  # as the pod runs it: under `inferbus nats run`
    etc = tmp_path / "etc"
    (etc / "auth").mkdir(parents=True)
    (etc / "nats.conf").write_text(config_map["data"]["nats.conf"])
    for name, text in auth["stringData"].items():
        (etc / "auth" / name).write_text(text)
    creds = tmp_path / "creds"
    creds.mkdir()
    for item in listing["items"]:  # what the pods mount, by user name
        if "creds.json" in item["stringData"]:
            data = item["stringData"]["creds.json"]
            (creds / f"{json.loads(data)['user']}.json").write_text(data)

    suffix = secrets.token_hex(3)
    network = f"ib-nats-{suffix}"
    names = [f"ib-nats-{i}-{suffix}" for i in range(NODES)]
    docker("network", "create", network)
    try:
        for i, name in enumerate(names):
            aliases = [f"nats-{i}.{NATS_PEERS}", f"nats-{i}"] + (["nats"] if i == 0 else [])
            docker(
                "run",
                "-d",
                "--name",
                name,
                "--network",
                network,
                *[a for alias in aliases for a in ("--network-alias", alias)],
                "-e",
                f"POD_NAME=nats-{i}",
                "-v",
                f"{etc / 'nats.conf'}:/etc/nats/nats.conf:ro",
                "-v",
                f"{etc / 'auth'}:/etc/nats/auth:ro",
                "--tmpfs",
                "/data:rw,uid=10001,gid=10001",
                "--entrypoint",
                command[0],
                IMAGE,
                *command[1:],
            )
        out = docker(
            "run",
            "--rm",
            "--network",
            network,
            "--user",
            "0",
            "-v",
            f"{creds}:/creds:ro",
            "--entrypoint",
            "python3",
            IMAGE,
            "-c",
            CHECK,
            timeout=180,
        )
        result = json.loads(out.strip().splitlines()[-1])
        assert result["replicas"] == 3 and result["messages"] == 1, result
        assert result["service_connected"] is True, result
        assert result["anonymous"].startswith("refused"), result
    except AssertionError:
        for name in names:
            print(
                name,
                subprocess.run(
                    ["docker", "logs", "--tail", "30", name], capture_output=True, text=True
                ).stderr,
            )
        raise
    finally:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True)
        subprocess.run(["docker", "network", "rm", network], capture_output=True)
