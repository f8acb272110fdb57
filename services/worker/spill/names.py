"""How the worker names the KV spill connector to vLLM and talks to it (no vLLM or
torch import here: the worker reads these before its engine is built)."""

from __future__ import annotations

from typing import Any

CONNECTOR = "InferbusSpillConnector"
MODULE = "inferbus.services.worker.spill.connector"
NAMESPACE_PARAM = "kv_namespace"
"""The ``kv_transfer_params`` key a request names its weights under."""
RESTORE_PARAM = "inferbus_kv_restore"
"""The key of a finished request's ``kv_transfer_params`` that says what it restored."""


def extra_config(
    host_bytes: int, disk_dir: str, disk_bytes: int, shared_dir: str = ""
) -> dict[str, Any]:
    """The connector's ``kv_connector_extra_config``."""
    return {
        "host_bytes": host_bytes,
        "disk_dir": disk_dir,
        "disk_bytes": disk_bytes,
        "shared_dir": shared_dir,
    }
