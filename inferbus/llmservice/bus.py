"""The LLMService's bus side, shared by the operator and ``inferbus apply``: what the
delivery service says of a model, and the records and rollouts the core decided."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from inferbus.contracts import (
    DeployRequest,
    LLMServiceSettings,
    RolloutDecision,
    delivery_command_subject,
    llmservice_subject,
    rollout_subject,
)
from inferbus.shared import modelstore
from inferbus.shared.bus import publish_durable
from inferbus.shared.codec import decode_or_none

from . import render
from .render import DeliveryView
from .spec import LLMService


async def _last(js: JetStreamContext, stream: str, subject: str) -> bytes | None:
    try:
        msg = await js.get_last_msg(stream, subject)
    except NotFoundError:
        return None
    return msg.data


async def delivery_view(js: JetStreamContext, model: str) -> DeliveryView:
    current = await modelstore.get_current(js, model)
    data = await _last(js, "IB_DELIVERY", rollout_subject(model))
    last = decode_or_none(data, RolloutDecision) if data else None
    return DeliveryView(
        current=current.version if current else "",
        last_action=last.action if last else "",
        last_version=last.version if last else "",
        last_reason=last.reason if last else "",
        last_at=last.decided_at if last else 0.0,
    )


async def current_settings(js: JetStreamContext, model: str) -> LLMServiceSettings | None:
    data = await _last(js, "IB_CONFIG", llmservice_subject(model))
    return decode_or_none(data, LLMServiceSettings) if data else None


def same(a: LLMServiceSettings | None, b: LLMServiceSettings) -> bool:
    """Equal but for who set them and when: nothing to publish."""
    if a is None:
        return False
    strip: dict[str, Any] = {"set_by": "", "set_at": 0.0}
    return msgspec.structs.replace(a, **strip) == msgspec.structs.replace(b, **strip)


async def publish_settings(js: JetStreamContext, settings: LLMServiceSettings) -> None:
    await publish_durable(
        js,
        llmservice_subject(settings.model),
        settings,
        request_id=f"llmservice-{settings.model}",
        msg_id=f"llmservice:{settings.service}:{settings.generation}:{settings.set_at}",
    )


async def ask_deploy(js: JetStreamContext, req: DeployRequest) -> None:
    await publish_durable(
        js,
        delivery_command_subject(req.model),
        req,
        request_id=f"deploy-{req.model}",
        msg_id=f"deploy:{req.model}:{req.version}:{req.requested_at}",
    )


@dataclass(frozen=True)
class Synced:
    changed: bool
    """The settings record was new or different, and went out."""
    request: DeployRequest | None
    """The rollout asked for now, if any."""
    delivery: DeliveryView
    """What the delivery service said of the model before the request."""
    asked: str
    """``<generation>:<version>`` of the last rollout asked for."""


async def sync(
    js: JetStreamContext,
    svc: LLMService,
    existing: LLMServiceSettings | None,
    *,
    scale_target: str,
    asked: str | None,
    set_by: str,
    now: float,
) -> Synced:
    """Send what the core decides for ``svc`` (its model not taken by another): its
    settings record when it changed, and the rollout its version needs. ``existing``:
    the model's live record; ``asked``: the last rollout asked for, None to read it
    from that record."""
    settings = render.service_settings(svc, scale_target=scale_target, set_by=set_by, now=now)
    changed = not same(existing, settings)
    if changed:
        await publish_settings(js, settings)
    delivery = await delivery_view(js, svc.spec.model.name)
    if asked is None:
        asked = render.asked_by_record(svc, existing)
    req = render.deploy_request(svc, delivery, asked, set_by=set_by, now=now)
    if req is not None:
        await ask_deploy(js, req)
        asked = render.ask_key(svc)
    return Synced(changed=changed, request=req, delivery=delivery, asked=asked)


async def withdraw(js: JetStreamContext, svc: LLMService, *, set_by: str, now: float) -> bool:
    """The LLMService is gone: its model's record is removed, if the live one is its
    own (the services go back to their flags). False when there was none."""
    model = svc.spec.model.name
    if not render.owns(svc, await current_settings(js, model)):
        return False
    await publish_settings(js, render.removed_settings(model, svc.key, set_by=set_by, now=now))
    return True
