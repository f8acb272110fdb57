"""The closed bus's pure parts: what a tenant's record does to its request, tenants'
cancels in the scheduler core, and the users and permissions the server is given."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest

from inferbus import busauth, servicetable
from inferbus.contracts import RequestRejected, RequestSubmitted, SamplingParams, TenantPolicy
from inferbus.services.sanitizer.tenants import admit_tenant
from inferbus.services.scheduler.core import Cancel, SchedulerCore
from inferbus.shared.buscreds import load_credentials


def request(**kw) -> RequestSubmitted:
    base = dict(
        request_id="r1",
        model="m",
        prompt="hi",
        reply_to="ib.reply.tenant.acme.r1",
        tenant="evil",
        priority="interactive",
        input_policy="off",
        mask_pii=False,
        client_reply_to="ib.reply.tenant.beta.r9",
    )
    return RequestSubmitted(**{**base, **kw})


def test_the_record_not_the_payload_sets_tenant_priority_and_policies():
    out = admit_tenant(request(), "acme", TenantPolicy(tenant="acme", priority="batch"))
    assert isinstance(out, RequestSubmitted)
    assert (out.tenant, out.priority, out.input_policy, out.mask_pii) == ("acme", "batch", "", None)
    assert out.client_reply_to == ""


@pytest.mark.parametrize(
    "policy, req, code, param",
    [
        (None, request(), "permission_denied", None),
        (TenantPolicy(tenant="acme", revoked=True), request(), "permission_denied", None),
        (
            TenantPolicy(tenant="acme"),
            request(reply_to="ib.reply.tenant.beta.r1"),
            "invalid_request",
            "reply_to",
        ),
        (
            TenantPolicy(tenant="acme"),
            request(reply_to="_INBOX.x.y"),
            "invalid_request",
            "reply_to",
        ),
        (
            TenantPolicy(tenant="acme"),
            request(reply_to="ib.reply.tenant.acme."),
            "invalid_request",
            "reply_to",
        ),
        (TenantPolicy(tenant="acme", models=["other"]), request(), "permission_denied", "model"),
        (
            TenantPolicy(tenant="acme", max_tokens=8),
            request(sampling=SamplingParams(max_tokens=9)),
            "permission_denied",
            "max_tokens",
        ),
    ],
)
def test_what_a_tenant_s_record_refuses(policy, req, code, param):
    out = admit_tenant(req, "acme", policy)
    assert isinstance(out, RequestRejected) and (out.code, out.param) == (code, param)


def test_a_tenant_s_cancel_touches_its_own_requests_only():
    core = SchedulerCore()
    core.on_accepted(request(request_id="a", tenant="acme"), 0.0)
    core.on_accepted(request(request_id="b", tenant="beta"), 0.0)  # queued: no worker
    assert core.on_cancel("a", "hostile", tenant="beta") == []
    assert core.is_queued("a")
    (effect,) = core.on_cancel("a", "mine", tenant="acme")
    assert isinstance(effect, Cancel) and effect.request.request_id == "a"
    (effect,) = core.on_cancel("b", "platform")  # the gateway's: any tenant's
    assert isinstance(effect, Cancel)
    # a cancel that arrives before its request counts for its tenant only
    assert core.on_cancel("c", "early", tenant="beta") == []
    assert core.on_accepted(request(request_id="c", tenant="acme"), 1.0) == []
    assert core.is_queued("c")


# -- users and permissions ----------------------------------------------------------------


@pytest.fixture
def registry(tmp_path: Path) -> busauth.Registry:
    reg = busauth.Registry.open(tmp_path / "auth")
    reg.operator()
    reg.supervisor("local")
    reg.tenant("acme")
    for e in servicetable.SERVICES:
        reg.service(e.name, e.instance_name(0))
    return reg


def users_of(reg: busauth.Registry) -> dict[str, dict]:
    text = reg.server_config(servicetable.permissions())
    assert text.startswith("accounts ")
    accounts = json.loads(text[len("accounts ") :])
    return {u["user"]: u for a in accounts.values() for u in a["users"]}


def test_tenants_have_an_account_of_their_own(registry: busauth.Registry):
    """A tenant in the platform's account could have the server publish a PubAck on
    any platform subject it names as its reply (issue 42 item 1); in one account with
    the other tenants, its connections would bound theirs too."""
    registry.tenant("globex", max_connections=3)
    text = registry.server_config(servicetable.permissions())
    accounts = json.loads(text[len("accounts ") :])
    platform = accounts[busauth.PLATFORM_ACCOUNT]
    assert set(accounts) == {"PLATFORM", "TENANT_acme", "TENANT_globex"}
    assert not {"tenant-acme", "tenant-globex"} & {u["user"] for u in platform["users"]}
    assert platform["jetstream"] == "enabled"
    exported = {next(iter(e.values())) for e in platform["exports"]}
    assert exported == {"ib.req.submitted.*", "ib.ctl.cancel.*", "ib.reply.tenant.*.>"}
    acme = accounts["TENANT_acme"]
    assert [u["user"] for u in acme["users"]] == ["tenant-acme"]
    assert "jetstream" not in acme
    imported = {next(iter(i.values()))["subject"] for i in acme["imports"]}
    assert imported == {"ib.req.submitted.acme", "ib.ctl.cancel.acme", "ib.reply.tenant.acme.>"}
    assert acme["limits"] == {"max_connections": busauth.TENANT_CONNECTIONS}
    assert accounts["TENANT_globex"]["limits"] == {"max_connections": 3}
    registry.tenant("globex")  # issued again without a limit: it keeps its own
    assert busauth.Registry.open(registry.folder).users["tenant-globex"].max_connections == 3


def test_two_processes_changing_users_keep_each_others(registry: busauth.Registry):
    """Found by the autoscaler's end-to-end test: ``inferbus up`` kept its users in
    memory, so adding a worker's user after ``inferbus creds new`` made a tenant
    rewrote users.json and the server's config without the tenant, and its client was
    refused ('Authorization Violation') from the next reload on."""
    up = busauth.Registry.open(registry.folder)  # inferbus up's copy, opened at start
    cli = busauth.Registry.open(registry.folder)  # inferbus creds new, another process
    cli.tenant("late")
    up.service("worker", "worker-7")  # the supervisor scales up
    up.write_server_config(servicetable.permissions())
    on_disk = busauth.Registry.open(registry.folder)
    assert {"tenant-late", "svc-worker-7"} <= on_disk.users.keys()
    assert "tenant-late" in (registry.folder / "nats.conf").read_text()
    cli.remove("tenant-late")  # and a revoke is not undone by the next scale either
    up.service("worker", "worker-8")
    up.write_server_config(servicetable.permissions())
    assert "tenant-late" not in (registry.folder / "nats.conf").read_text()


def test_credentials_are_private_and_the_server_keeps_hashes_only(registry: busauth.Registry):
    users = users_of(registry)
    for name, user in users.items():
        creds = load_credentials(registry.creds_path(name))
        assert user["password"].startswith("$2") and creds.password not in json.dumps(user)
        assert stat.S_IMODE(registry.creds_path(name).stat().st_mode) == 0o600
    assert load_credentials(registry.creds_path("tenant-acme")).tenant == "acme"
    again = busauth.Registry.open(registry.folder)  # reopened: the same users, same secrets
    assert again.users.keys() == registry.users.keys()


def test_a_wrong_password_costs_the_server_little(registry: busauth.Registry):
    """Issue 42 item 4: the server checks a CONNECT's password against its bcrypt hash,
    wrong ones too; at cost 10 (50 ms each) 13 a second pinned it. The passwords are
    random, so the least cost serves; hashes an older version made are made again."""
    import bcrypt

    for user in users_of(registry).values():
        assert user["password"].startswith("$2b$04$")
    name = "tenant-acme"
    password = load_credentials(registry.creds_path(name)).password
    old = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()
    registry.users[name].password_hash = old
    registry.save()
    registry.write_server_config(servicetable.permissions())
    rehashed = users_of(busauth.Registry.open(registry.folder))[name]["password"]
    assert rehashed.startswith("$2b$04$") and bcrypt.checkpw(password.encode(), rehashed.encode())


def test_a_tenant_may_touch_its_own_subjects_only(registry: busauth.Registry):
    p = users_of(registry)["tenant-acme"]["permissions"]
    assert p["publish"]["allow"] == ["ib.req.submitted.acme", "ib.ctl.cancel.acme"]
    assert p["subscribe"]["allow"] == ["ib.reply.tenant.acme.>", "_INBOX.tenant-acme.>"]
    assert "allow_responses" not in p


def test_no_one_but_the_operator_deletes_or_reads_everything(registry: busauth.Registry):
    for name, user in users_of(registry).items():
        allowed = (
            user["permissions"]["publish"]["allow"] + user["permissions"]["subscribe"]["allow"]
        )
        if name == busauth.OPERATOR:
            assert allowed == [">", ">"]
            continue
        assert ">" not in allowed and "$JS.API.>" not in allowed, name
        assert not any(re.search(r"DELETE|PURGE", s) and "CONSUMER" not in s for s in allowed)


def test_a_worker_s_subjects_are_its_instance_s(registry: busauth.Registry):
    p = users_of(registry)["svc-worker-0"]["permissions"]
    assert "ib.hb.worker-0.*" in p["publish"]["allow"]
    assert "ib.kv.worker-0.*" in p["publish"]["allow"]
    assert "$JS.API.CONSUMER.CREATE.IB_WORK.*.ib.work.worker-0.*" in p["publish"]["allow"]
    assert not any(
        s.startswith(("ib.hb.>", "ib.hb.*.", "ib.work.>")) for s in p["publish"]["allow"]
    )
    assert not any("{" in s for s in p["publish"]["allow"] + p["subscribe"]["allow"])


@pytest.mark.parametrize("name", ["", "a.b", "x" * 65, "with space", "gw"])
def test_tenant_names_are_single_subject_tokens(registry: busauth.Registry, name: str):
    with pytest.raises(ValueError):
        registry.tenant(name)


def test_removing_a_user_drops_it_from_the_server(registry: busauth.Registry):
    assert registry.remove("tenant-acme")
    assert "tenant-acme" not in users_of(registry)
    assert not registry.creds_path("tenant-acme").exists()
