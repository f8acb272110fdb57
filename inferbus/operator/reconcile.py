"""One LLMService brought to what its spec asks: the adapter around the pure core
(inferbus/llmservice/render.py). Every call is idempotent, so a timer runs it again."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import yaml
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
            return _status(previous, render.Status("Degraded", "InvalidSpec", str(exc)),
                           generation, now)  # fmt: skip
        model = svc.spec.model.name
        existing = await bus.current_settings(self.js, model)
        taken = render.conflict(svc, existing)
        if taken:
            return _status(
                previous, render.Status("Degraded", "ModelTaken", taken), generation, now
            )
        ns = svc.metadata.namespace
        live = await self.kube.read_deployment(ns, render.worker_name(svc))
        workers = await self.kube.apply(
            render.worker_deployment(
                svc, self.cluster, render.DeploymentView.of(live).replicas if live else None
            )
        )
        for obj in render.scale_access(svc, self.cluster.autoscaler_account):
            await self.kube.apply(obj)
        rules = render.prometheus_rules(svc)
        if rules is not None:
            await self.kube.apply(
                render.rules_configmap(svc, yaml.safe_dump(rules, sort_keys=False))
            )
        elif previous.get("rules"):
            await self.kube.delete_config_map(ns, render.rules_name(svc))
        settings = render.service_settings(
            svc, scale_target=f"{ns}/{render.worker_name(svc)}", set_by=self.name, now=now
        )
        if not bus.same(existing, settings):
            await bus.publish_settings(self.js, settings)
            log.info("settings published", llmservice=svc.key, model=model)
        delivery = await bus.delivery_view(self.js, model)
        asked = str(previous.get("requested") or "")
        req = render.deploy_request(svc, delivery, asked, set_by=self.name, now=now)
        if req is not None:
            await bus.ask_deploy(self.js, req)
            asked = render.ask_key(svc)
            log.info("rollout asked", llmservice=svc.key, model=model, version=req.version)
        view = render.DeploymentView.of(workers)
        st = render.status(svc, view, delivery, str(previous.get("phase") or ""), now)
        out = _status(previous, st, generation, now)
        out.update(
            replicas=view.replicas,
            readyReplicas=view.ready,
            servedVersion=delivery.current,
            requested=asked,
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
        existing = await bus.current_settings(self.js, svc.spec.model.name)
        if existing is not None and existing.service == svc.key and not existing.removed:
            await bus.publish_settings(
                self.js,
                render.removed_settings(svc.spec.model.name, svc.key, set_by=self.name, now=now),
            )


def _status(
    previous: dict[str, Any], st: render.Status, generation: int, now: float
) -> dict[str, Any]:
    """The status fields, with a Ready condition that keeps its transition time while
    its truth holds."""
    ready = "True" if st.phase == "Ready" else "False"
    before = next((c for c in previous.get("conditions") or [] if c.get("type") == "Ready"), None)
    since = (
        before["lastTransitionTime"]
        if before and before.get("status") == ready and before.get("lastTransitionTime")
        else datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    )
    return {
        "phase": st.phase,
        "reason": st.reason,
        "message": st.message,
        "observedGeneration": generation,
        "conditions": [
            {
                "type": "Ready",
                "status": ready,
                "reason": st.reason,
                "message": st.message,
                "lastTransitionTime": since,
                "observedGeneration": generation,
            }
        ],
    }
