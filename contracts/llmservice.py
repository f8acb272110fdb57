"""What an ``LLMService`` asks of the running services, per model.

An ``LLMService`` (inferbus/llmservice: the Kubernetes resource, or a file given to
``inferbus apply``) is rendered to one ``LLMServiceSettings`` record on
``ib.cfg.llmservice.<model>`` (JetStream IB_CONFIG, the latest kept). The autoscaler
sizes the model's workers by it and the sanitizer checks and filters the model's
requests by it; the record overrides their flags for that model only.
"""

from __future__ import annotations

import msgspec

from .events import Event

__all__ = ["LLMServiceSettings", "ScalingSettings"]


class ScalingSettings(msgspec.Struct, kw_only=True, frozen=True):
    min_replicas: int = 1
    max_replicas: int = 8
    target_utilization: float = 0.8
    """Share of a worker's measured capacity the sizing plans to use."""
    ttft_slo_s: float = 2.0
    predictive_window_s: float = 120.0
    """The span of recent load the forecaster fits its prediction on."""
    forecaster: str = ""
    """constant, holt, trend or statsforecast; empty: the autoscaler's own."""


class LLMServiceSettings(Event, tag="llmservice.settings"):
    service: str
    """The LLMService it comes from: ``namespace/name`` on Kubernetes, ``name`` locally."""
    model: str
    """The name requests ask for."""
    version: str = ""
    """The registry version the service asks for (delivery rolls it out); empty: the
    version its workers were started with."""
    scaling: ScalingSettings | None = None
    """None: the autoscaler leaves the model alone."""
    scale_target: str = ""
    """What runs its workers: a scalable service of ``inferbus up`` (``worker``) or a
    Kubernetes Deployment (``namespace/name``); empty: the autoscaler's ``--models``."""
    input_policy: str = ""
    """``block``, ``flag`` or ``off``; empty: the sanitizer's own for the model. An API
    key's or tenant's policy still wins."""
    data_policy: str = ""
    """For instructions in data (tool results): ``block``, ``flag``, ``spotlight`` or
    ``off``; empty: the sanitizer's own. An API key's or tenant's policy still wins."""
    mask_output_pii: bool | None = None
    """None: the sanitizer's own; a request's API key or tenant still wins."""
    tool_call_policy: str = ""
    """``mask`` or ``refuse`` a tool call carrying PII the request never gave; empty:
    the sanitizer's own. A request's API key or tenant still wins."""
    removed: bool = False
    """The LLMService was deleted: the services forget the model's record."""
    generation: int = 0
    """The LLMService's ``metadata.generation`` this record renders."""
    set_by: str = ""
    set_at: float = 0.0
