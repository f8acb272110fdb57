"""The LLMService CustomResourceDefinition, its OpenAPI schema made from the spec's
Structs (one source: the API server checks what ``spec.load`` checks, bar the checks
across fields)."""

from __future__ import annotations

from typing import Any

import msgspec

from .render import PHASES
from .spec import GROUP, KIND, PLURAL, VERSION, LLMServiceSpec

_KEEP = (
    "type",
    "description",
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "default",
    "format",
)


def _structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema (msgspec's) → Kubernetes' structural OpenAPI v3: no $ref, a type
    on every node, ``exclusiveMinimum`` as OpenAPI 3.0's boolean."""
    if "$ref" in node:
        return _structural(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in node:  # X | None
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        out = _structural(options[0], defs)
        out["nullable"] = True
        return out
    out = {k: node[k] for k in _KEEP if k in node}
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if "exclusiveMinimum" in node:
        out["minimum"], out["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if "exclusiveMaximum" in node:
        out["maximum"], out["exclusiveMaximum"] = node["exclusiveMaximum"], True
    if node.get("type") == "object":
        if "properties" in node:
            out["properties"] = {k: _structural(v, defs) for k, v in node["properties"].items()}
            if node.get("required"):
                out["required"] = node["required"]
        elif isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = _structural(node["additionalProperties"], defs)
        out.pop("title", None)
    if node.get("type") == "array":
        out["items"] = _structural(node["items"], defs)
    return out


def spec_schema() -> dict[str, Any]:
    (ref,), defs = msgspec.json.schema_components([LLMServiceSpec], ref_template="#/$defs/{name}")
    return _structural(ref, defs)


def status_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": list(PHASES)},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "observedGeneration": {"type": "integer"},
            "replicas": {"type": "integer"},
            "readyReplicas": {"type": "integer"},
            "servedVersion": {"type": "string"},
            "rules": {"type": "boolean", "description": "its rule file's ConfigMap exists"},
            "requested": {
                "type": "string",
                "description": "generation:version of the last rollout asked for",
            },
            "conditions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type", "status"],
                    "properties": {
                        "type": {"type": "string"},
                        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                        "reason": {"type": "string"},
                        "message": {"type": "string"},
                        "lastTransitionTime": {"type": "string", "format": "date-time"},
                        "observedGeneration": {"type": "integer"},
                    },
                },
            },
        },
    }


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["llms"],
                "categories": ["inferbus"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
                        {"name": "Version", "type": "string", "jsonPath": ".spec.model.version"},
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
                        {
                            "name": "Age",
                            "type": "date",
                            "jsonPath": ".metadata.creationTimestamp",
                        },
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "One model served by inferbus: its version, "
                            "workers, scaling, checks and observability.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }
