"""One LLMService brought to what its spec asks: the adapter around the pure core
(inferbus/llmservice/render.py). Every call is idempotent, so a timer runs it again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext

from inferbus.llmservice import bus, render
from inferbus.llmservice.spec import SpecError, load
from inferbus.shared import logs

from .kube import KubeApi

log = logs.get("inferbus.operator")


@dataclass
class Operator:
    kube: KubeApi
    js: JetStreamContext
    cluster: render.Cluster
    name: str = "inferbus-operator"

    async def reconcile(
        self, body: dict[str, Any], previous: dict[str, Any], now: float
    ) -> dict[str, Any]:
        """Apply, publish and ask what the spec needs; the status to write."""
        generation = int((body.get("metadata") or {}).get("generation") or 0)
        try:
            svc = load(body)
        except SpecError as exc:
            st = render.Status("Degraded", "InvalidSpec", str(exc))
            return render.status_fields(st, previous, generation, now)
        model = svc.spec.model.name
        existing = await bus.current_settings(self.js, model)
        taken = render.conflict(svc, existing)
        if taken:
            st = render.Status("Degraded", "ModelTaken", taken)
            return render.status_fields(st, previous, generation, now)
        # the cluster first: an API error leaves the bus as it was (kopf retries)
        ns = svc.metadata.namespace
        live = await self.kube.read_deployment(ns, render.worker_name(svc))
        workers = await self.kube.apply(
            render.worker_deployment(
                svc, self.cluster, render.DeploymentView.of(live).replicas if live else None
            )
        )
        for obj in render.scale_access(svc, self.cluster.autoscaler_account):
            await self.kube.apply(obj)
        rules = render.rules_text(svc)
        if rules is not None:
            await self.kube.apply(render.rules_configmap(svc, rules))
        elif previous.get("rules"):
            await self.kube.delete_config_map(ns, render.rules_name(svc))
        synced = await bus.sync(
            self.js,
            svc,
            existing,
            scale_target=f"{ns}/{render.worker_name(svc)}",
            asked=str(previous.get("requested") or ""),
            set_by=self.name,
            now=now,
        )
        if synced.changed:
            log.info("settings published", llmservice=svc.key, model=model)
        if synced.request is not None:
            log.info(
                "rollout asked", llmservice=svc.key, model=model, version=synced.request.version
            )
        view = render.DeploymentView.of(workers)
        st = render.status(svc, view, synced.delivery, str(previous.get("phase") or ""), now)
        out = render.status_fields(st, previous, generation, now)
        out.update(
            replicas=view.replicas,
            readyReplicas=view.ready,
            servedVersion=synced.delivery.current,
            requested=synced.asked,
            rules=rules is not None,
        )
        return out

    async def forget(self, body: dict[str, Any], now: float) -> None:
        """The LLMService is deleted: the services drop its record (its objects go with
        it, by their owner reference)."""
        try:
            svc = load(body)
        except SpecError:
            return  # never rendered: nothing was published
        await bus.withdraw(self.js, svc, set_by=self.name, now=now)
