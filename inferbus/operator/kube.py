"""The operator's calls to the API server: server-side apply of what the core renders,
a read of the worker Deployment, a delete of a rule file no longer asked for."""

from __future__ import annotations

import json
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

FIELD_MANAGER = "inferbus-operator"


class KubeApi:
    def __init__(self, api: client.ApiClient) -> None:
        self._client = api
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)

    @classmethod
    async def connect(cls, kubeconfig: str = "") -> KubeApi:
        """The pod's service account, or a kubeconfig file."""
        if kubeconfig:
            await config.load_kube_config(config_file=kubeconfig)
        else:
            config.load_incluster_config()
        return cls(client.ApiClient())

    async def read_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await _body(
                await self.apps.read_namespaced_deployment(name, namespace, _preload_content=False)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply, the operator owning the fields it sets (``force``: they
        are its own; the replicas a scaler set are kept by the core, not here)."""
        meta = obj["metadata"]
        kw: dict[str, Any] = {
            "field_manager": FIELD_MANAGER,
            "force": True,
            "_content_type": "application/apply-patch+yaml",
            "_preload_content": False,
        }
        call: Any
        if obj["kind"] == "Deployment":
            call = self.apps.patch_namespaced_deployment
        elif obj["kind"] == "ConfigMap":
            call = self.core.patch_namespaced_config_map
        elif obj["kind"] == "Role":
            call = self.rbac.patch_namespaced_role
        elif obj["kind"] == "RoleBinding":
            call = self.rbac.patch_namespaced_role_binding
        else:
            raise ValueError(f"the operator applies no {obj['kind']}")
        return await _body(await call(meta["name"], meta["namespace"], obj, **kw))

    async def delete_config_map(self, namespace: str, name: str) -> None:
        try:
            await _body(
                await self.core.delete_namespaced_config_map(
                    name, namespace, _preload_content=False
                )
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def close(self) -> None:
        await self._client.close()


async def _body(resp: Any) -> dict[str, Any]:
    """The object a raw response holds. Unread (``_preload_content=False``), the client
    raises nothing for an error status (found by the replayed 404): raised here."""
    data = await resp.read()
    if resp.status >= 400:
        raise ApiException(status=resp.status, reason=f"{resp.reason}: {data[:500]!r}")
    out = json.loads(data)
    if not isinstance(out, dict):
        raise ValueError("the API server answered with no object")
    return out
