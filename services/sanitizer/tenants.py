"""A tenant's request on the closed bus: who it is comes from the subject its
credentials allow it, what it may do from its record. No I/O."""

from __future__ import annotations

import msgspec

from inferbus.contracts import (
    FailureCode,
    RequestRejected,
    RequestSubmitted,
    TenantPolicy,
    tenant_reply_prefix,
)


def own_reply(request: RequestSubmitted, tenant: str) -> bool:
    """Its reply subject is under the tenant's own prefix: it may be answered there."""
    prefix = tenant_reply_prefix(tenant)
    return request.reply_to.startswith(prefix) and len(request.reply_to) > len(prefix)


def admit_tenant(
    request: RequestSubmitted, tenant: str, policy: TenantPolicy | None
) -> RequestSubmitted | RequestRejected:
    """The request as the tenant's record makes it (tenant, priority and policies from
    the record, whatever the payload said), or why it is refused. A reply subject
    outside the tenant's own is refused with ``param="reply_to"``: no answer is sent
    there (it may be another's)."""

    def reject(code: FailureCode, reason: str, param: str | None = None) -> RequestRejected:
        return RequestRejected(request_id=request.request_id, code=code, reason=reason, param=param)

    if policy is None or policy.revoked:
        why = "has been revoked" if policy is not None else "has no record"
        return reject(FailureCode.PERMISSION_DENIED, f"tenant {tenant!r} {why}")
    prefix = tenant_reply_prefix(tenant)
    if not own_reply(request, tenant):
        return reject(
            FailureCode.INVALID_REQUEST,
            f"reply_to must be under {prefix}<id> for tenant {tenant!r}",
            "reply_to",
        )
    if "*" not in policy.models and request.model not in policy.models:
        return reject(
            FailureCode.PERMISSION_DENIED,
            f"tenant {tenant!r} may not use model {request.model!r}",
            "model",
        )
    s = request.sampling
    if policy.max_tokens and s.output_tokens > policy.max_tokens:
        asked = f"max_tokens {s.max_tokens}" + (f" times n={s.n}" if s.n > 1 else "")
        return reject(
            FailureCode.PERMISSION_DENIED,
            f"{asked} is over tenant {tenant!r}'s cap of {policy.max_tokens}",
            "max_tokens",
        )
    return msgspec.structs.replace(
        request,
        tenant=tenant,
        priority=policy.priority,
        input_policy=policy.input_policy,
        data_policy=policy.data_policy,
        mask_pii=policy.mask_pii,
        tool_call_policy=policy.tool_call_policy,
        client_reply_to="",
    )
