"""``inferbus operator``: kopf runs the LLMService handlers (one replica: it runs
standalone, no peering), with its progress in annotations so the CRD's status keeps
only the fields the schema names. SIGTERM stops it gracefully (kopf's own handling)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import kopf

from inferbus.llmservice import render
from inferbus.llmservice.spec import GROUP, PLURAL, VERSION
from inferbus.shared import logs
from inferbus.shared.bus import connect
from inferbus.shared.buscreds import credentials_from_env
from inferbus.shared.streams import ensure_streams

from .kube import KubeApi
from .reconcile import Operator

log = logs.get("inferbus.operator")

RESYNC_S = 30.0
"""Each LLMService is reconciled again this often: its status follows its workers and
rollouts, and drift is put back."""


def registry(op: Operator) -> kopf.OperatorRegistry:
    reg = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)

    @kopf.on.resume(*resource, registry=reg)
    @kopf.on.create(*resource, registry=reg)
    @kopf.on.update(*resource, registry=reg)
    async def reconcile(body: kopf.Body, status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
        patch.status.update(await op.reconcile(dict(body), dict(status), time.time()))

    @kopf.timer(*resource, interval=RESYNC_S, idle=RESYNC_S, registry=reg)
    async def resync(body: kopf.Body, status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
        patch.status.update(await op.reconcile(dict(body), dict(status), time.time()))

    @kopf.on.delete(*resource, registry=reg)
    async def forget(body: kopf.Body, **_: Any) -> None:
        await op.forget(dict(body), time.time())

    return reg


def settings() -> kopf.OperatorSettings:
    s = kopf.OperatorSettings()
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    s.persistence.finalizer = f"{GROUP}/operator"
    s.posting.level = logging.WARNING  # warnings and errors become the LLMService's events
    return s


async def run(
    *,
    nats_url: str,
    kubeconfig: str,
    namespaces: list[str],
    cluster: render.Cluster,
    liveness: str,
) -> None:
    nc = await connect(nats_url, "inferbus-operator", credentials_from_env())
    kube = await KubeApi.connect(kubeconfig)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        op = Operator(kube=kube, js=js, cluster=cluster)
        log.info("operator starting", namespaces=namespaces or "all", image=cluster.image)
        await kopf.operator(
            registry=registry(op),
            settings=settings(),
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=liveness or None,
        )
    finally:
        await kube.close()
        await nc.drain()


def main(**kw: Any) -> None:
    asyncio.run(run(**kw))
