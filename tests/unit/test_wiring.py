"""Each service's declared subscriptions (services/<name>/wiring.py): every handler
exists, and the NATS permissions derived from them allow exactly what it declares."""

from __future__ import annotations

import inspect
import re

import pytest

from inferbus import busauth, servicetable
from inferbus.shared.subscriptions import (
    Consume,
    Listen,
    Own,
    Subscription,
    Wiring,
    as_permission,
    fill,
)

ENTRIES = servicetable.SERVICES
FIELDS = {"instance": "worker-0", "worker_id": "worker-0.a1b2c3", "gateway_id": "gw-x-a1b2c3"}


def attribute_types() -> dict[str, type]:
    """Handlers declared on an attribute of a service (``deliveries._on_delivery``)."""
    from inferbus.services.worker.delivery import Deliveries

    return {"deliveries": Deliveries}


def allowed(subject: str, patterns: tuple[str, ...]) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` the rest."""

    def match(pattern: str) -> bool:
        p, s = pattern.split("."), subject.split(".")
        for i, tok in enumerate(p):
            if tok == ">":
                return len(s) > i
            if i >= len(s) or (tok != "*" and tok != s[i]):
                return False
        return len(p) == len(s)

    return any(match(p) for p in patterns)


def user_permissions(entry: servicetable.ServiceEntry) -> busauth.Permissions:
    return busauth.service_permissions(
        entry.permissions(), entry.name, FIELDS["instance"], "svc-" + entry.name
    )


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_declared_handler_is_a_coroutine_of_the_service(entry):
    cls = entry.service_class()
    assert cls.wiring is entry.wiring_of(), "the service runs the wiring its permissions use"
    for sub in cls.wiring.subscriptions:
        owner: type = cls
        *attrs, method = sub.handler.split(".")
        for attr in attrs:
            owner = attribute_types()[attr]
        fn = getattr(owner, method, None)
        assert fn is not None, f"{entry.name}: no handler {sub.handler}"
        assert inspect.iscoroutinefunction(fn), sub.handler
        assert len(inspect.signature(fn).parameters) == 3, f"{sub.handler}(self, event, msg)"


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_the_permissions_allow_every_declared_subject(entry):
    perms = user_permissions(entry)
    wiring = entry.wiring_of()
    for sub in wiring.subscriptions:
        subject = fill(sub.subject, FIELDS)
        if isinstance(sub.source, Listen):
            assert allowed(subject, perms.subscribe), (entry.name, subject)
        elif isinstance(sub.source, Consume):
            assert allowed(sub.source.consumer.deliver_subject, perms.subscribe)
            assert allowed(f"$JS.ACK.{sub.source.consumer.stream}.x.1", perms.publish)
        elif isinstance(sub.source, Own):
            create = f"$JS.API.CONSUMER.CREATE.{sub.source.stream}.c.{subject}"
            assert allowed(create, perms.publish), (entry.name, create)
    for subject in wiring.publishes:
        assert allowed(fill(subject, FIELDS).replace("*", "x").replace(">", "x"), perms.publish)


def test_a_worker_may_read_its_own_work_only():
    perms = user_permissions(servicetable.get("worker"))
    mine = f"$JS.API.CONSUMER.CREATE.IB_WORK.c.ib.work.{FIELDS['worker_id']}"
    theirs = "$JS.API.CONSUMER.CREATE.IB_WORK.c.ib.work.worker-1.d4e5f6"
    assert allowed(mine, perms.publish) and not allowed(theirs, perms.publish)
    assert not allowed("ib.work.worker-1.d4e5f6", perms.subscribe)


def test_a_gateway_reads_its_own_replies_and_no_tenants():
    perms = user_permissions(servicetable.get("gateway"))
    assert allowed(f"ib.reply.gw.{FIELDS['gateway_id']}.r1", perms.subscribe)
    assert not allowed("ib.reply.tenant.acme.r1", perms.subscribe)


def test_adding_a_subscription_is_one_declaration():
    base = Wiring(publishes=("ib.x.out",))
    more = Wiring(
        subscriptions=(Subscription("ib.x.in.{instance}", bytes, "_on_x"),),
        publishes=base.publishes,
    )
    before, after = busauth.wiring_permissions(base), busauth.wiring_permissions(more)
    assert set(after.subscribe) - set(before.subscribe) == {"ib.x.in.{instance}"}
    assert after.publish == before.publish


def test_templates_read_as_permissions_without_the_nonce():
    assert as_permission("ib.work.{worker_id}") == "ib.work.{instance}.*"
    assert as_permission("ib.filter.{instance}.>") == "ib.filter.{instance}.>"
    assert not re.search(r"{(?!instance})", as_permission("ib.reply.gw.{gateway_id}.>"))
