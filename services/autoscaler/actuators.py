"""Carrying out scale decisions: one interface, a local and a Kubernetes implementation.

- ``LocalActuator``: ``inferbus up``'s supervisor, over its control subject
  (``ScaleService``; the workers it stops drain before they exit).
- ``KubernetesActuator``: the Deployment's ``scale`` subresource through
  kubernetes_asyncio (the official client's asyncio build), in-cluster credentials or
  a kubeconfig. It needs ``get`` and ``patch`` on ``deployments/scale`` in its
  namespace (deploy/k8s/base/autoscaler.yaml's Role). Kubernetes picks which pods go when a
  Deployment shrinks; the workers' preStop and grace period make them drain.
"""

from __future__ import annotations

from typing import Any, Protocol

from nats.aio.client import Client

from inferbus.contracts import ScaleDecision
from inferbus.contracts.control import (
    ScaleService,
    SupervisorQuery,
    SupervisorState,
    supervisor_subject,
)
from inferbus.shared.codec import decode, encode


class ActuationError(Exception):
    """A decision the actuator could not carry out (it is retried on the next tick)."""


class Actuator(Protocol):
    async def current(self, model: str) -> int | None:
        """Workers the platform runs for ``model`` now (None: unknown)."""
        ...

    async def apply(self, decision: ScaleDecision) -> None: ...

    def set_target(self, model: str, where: str) -> None:
        """``model``'s workers run in ``where`` from now on (an LLMService's record)."""
        ...

    def forget(self, model: str) -> None: ...

    async def close(self) -> None: ...


class LocalActuator:
    """Scales ``inferbus up``'s workers. ``targets`` maps each model to the scalable
    service that serves it (under ``inferbus up``: one model, the ``worker`` service)."""

    def __init__(
        self, nc: Client, targets: dict[str, str], supervisor: str, timeout_s: float = 10.0
    ) -> None:
        self.nc = nc
        self.targets = targets
        self.subject = supervisor_subject(supervisor)
        self.timeout_s = timeout_s

    async def _ask(self, command: Any) -> SupervisorState:
        try:
            reply = await self.nc.request(self.subject, encode(command), timeout=self.timeout_s)
        except Exception as exc:  # no supervisor answering: said, and retried next tick
            raise ActuationError(f"supervisor on {self.subject} did not answer: {exc}") from exc
        state = decode(reply.data, SupervisorState)
        if state.error:
            raise ActuationError(state.error)
        return state

    async def current(self, model: str) -> int | None:
        service = self.targets.get(model)
        if service is None:
            return None
        state = await self._ask(SupervisorQuery())
        return sum(1 for p in state.processes if p.service == service and p.state != "stopping")

    async def apply(self, decision: ScaleDecision) -> None:
        service = self.targets.get(decision.model)
        if service is None:
            raise ActuationError(f"no local service is set to serve {decision.model!r}")
        # a worker's id on the bus is <instance>.<nonce>: the supervisor knows instances
        stop_first = [wid.split(".", 1)[0] for wid in decision.stop_first]
        await self._ask(
            ScaleService(service=service, instances=decision.desired, stop_first=stop_first)
        )

    def set_target(self, model: str, where: str) -> None:
        self.targets[model] = where

    def forget(self, model: str) -> None:
        self.targets.pop(model, None)

    async def close(self) -> None:
        pass


class KubernetesActuator:
    """Sets ``spec.replicas`` of each model's Deployment through its scale subresource.
    ``targets`` maps a model to ``namespace/deployment``."""

    def __init__(self, targets: dict[str, str], kubeconfig: str = "") -> None:
        self.targets: dict[str, tuple[str, str]] = {}
        for model, where in targets.items():
            self.set_target(model, where)
        self.kubeconfig = kubeconfig
        self._api: Any = None
        self._client: Any = None

    async def _apps(self) -> Any:
        if self._api is None:
            from kubernetes_asyncio import client, config

            if self.kubeconfig:
                await config.load_kube_config(config_file=self.kubeconfig)
            else:
                config.load_incluster_config()
            self._client = client.ApiClient()
            self._api = client.AppsV1Api(self._client)
        return self._api

    def set_target(self, model: str, where: str) -> None:
        namespace, sep, name = where.partition("/")
        if not sep or not namespace or not name:
            raise ValueError(
                f"model {model!r}: a Kubernetes target is namespace/deployment, got {where!r}"
            )
        self.targets[model] = (namespace, name)

    def forget(self, model: str) -> None:
        self.targets.pop(model, None)

    def _target(self, model: str) -> tuple[str, str]:
        try:
            return self.targets[model]
        except KeyError:
            raise ActuationError(f"no Deployment is set to serve {model!r}") from None

    async def current(self, model: str) -> int | None:
        if model not in self.targets:
            return None
        namespace, name = self._target(model)
        try:
            scale = await (await self._apps()).read_namespaced_deployment_scale(name, namespace)
        except Exception as exc:
            raise ActuationError(f"reading {namespace}/{name}'s scale: {exc}") from exc
        return int(scale.spec.replicas or 0)

    async def apply(self, decision: ScaleDecision) -> None:
        namespace, name = self._target(decision.model)
        body = {"spec": {"replicas": decision.desired}}
        try:
            await (await self._apps()).patch_namespaced_deployment_scale(
                name,
                namespace,
                body,
                field_manager="inferbus-autoscaler",
                # a merge patch of spec.replicas alone: nothing else of the Deployment
                _content_type="application/merge-patch+json",
            )
        except Exception as exc:
            raise ActuationError(f"scaling {namespace}/{name}: {exc}") from exc

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


class NoActuator:
    """Decides and records only (``--actuator none``): for a dry run, or when another
    system (KEDA, an operator) acts on the decisions from IB_SCALE."""

    async def current(self, model: str) -> int | None:
        return None

    async def apply(self, decision: ScaleDecision) -> None:
        pass

    def set_target(self, model: str, where: str) -> None:
        pass

    def forget(self, model: str) -> None:
        pass

    async def close(self) -> None:
        pass
