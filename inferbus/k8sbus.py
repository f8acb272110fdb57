"""The closed bus of a Kubernetes deployment as Secrets (``inferbus creds k8s``).

On Kubernetes a Deployment's pods are named at run time, so the users are one per
service (``Registry.service_role``), not one per instance as under ``inferbus up`` and
compose; every pod of a service mounts its Secret ``inferbus-bus-<service>``. The NATS
StatefulSet (deploy/k8s/base/nats.yaml) includes ``inferbus-nats-auth``: the users and
their permissions, and its cluster block with the routes' password.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferbus import servicetable
from inferbus.busauth import ANY, OPERATOR, Registry, route_password

NATS_STATEFULSET = "nats"
NATS_PEERS = "nats-cluster"
"""The headless Service the StatefulSet's pods are named under (nats-0.nats-cluster)."""
ROUTE_PORT = 6222
ROUTE_USER = "route"


def make_users(folder: Path) -> Registry:
    """The operator and one user per service of the table, in ``folder`` (kept: users
    already there keep their passwords)."""
    reg = Registry.open(folder)
    reg.operator()
    for entry in servicetable.SERVICES:
        reg.service_role(entry.name)
    return reg


def cluster_block(password: str, replicas: int) -> str:
    """nats-server's cluster configuration for the StatefulSet's ``replicas`` pods."""
    routes = [
        f"nats://{ROUTE_USER}:{password}@{NATS_STATEFULSET}-{i}.{NATS_PEERS}:{ROUTE_PORT}"
        for i in range(replicas)
    ]
    block = {
        "name": "inferbus",
        "listen": f"0.0.0.0:{ROUTE_PORT}",
        "authorization": {"user": ROUTE_USER, "password": password},
        "routes": routes,
    }
    return "cluster " + json.dumps(block, indent=2) + "\n"


def _secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "inferbus"}},
        "type": "Opaque",
        "stringData": data,
    }


def bus_secrets(folder: Path, nats_replicas: int = 3) -> dict[str, Any]:
    """Every Secret of the bus, as one ``List`` for ``kubectl apply -f -``."""
    reg = make_users(folder)
    items = []
    for user in reg.users.values():
        # a folder that also served compose has users per instance: not for pods
        if (user.role == "service" and user.name == ANY) or user.user == OPERATOR:
            name = f"inferbus-bus-{user.service or OPERATOR}"
            items.append(_secret(name, {"creds.json": reg.creds_path(user.user).read_text()}))
    reg.rehash()
    conf = {"users.conf": reg.server_config(servicetable.permissions())}
    if nats_replicas > 1:
        conf["cluster.conf"] = cluster_block(route_password(folder), nats_replicas)
    else:  # a lone node: nothing to route to (nats.yaml includes the file all the same)
        conf["cluster.conf"] = "# one node: no cluster\n"
    items.append(_secret("inferbus-nats-auth", conf))
    return {"apiVersion": "v1", "kind": "List", "items": items}
