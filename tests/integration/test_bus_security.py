"""The closed bus, attacked as a hostile tenant and a rogue worker would, on the real
platform (`inferbus up --engine sim`, closed by default): each attack is refused (an
auth error or a permissions violation), and the legitimate paths still work."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nats
import pytest
from testkit.deadletters import letter_about
from testkit.ports import metrics_port_base

from inferbus.client import Client, RequestError
from inferbus.contracts import (
    STREAMS,
    CancelRequest,
    ReplyEvent,
    RequestAccepted,
    RequestCancelled,
    RequestFailed,
    RequestFinished,
    RequestSubmitted,
    SamplingParams,
    Terminal,
    WorkerHeartbeat,
    tenant_reply_prefix,
    tenant_request_id,
)
from inferbus.shared.bus import BusAuthError, connect
from inferbus.shared.buscreds import BusCredentials, load_credentials
from inferbus.shared.codec import decode, decode_or_none, encode
from inferbus.shared.natsserver import free_ports

pytestmark = pytest.mark.integration

INFERBUS = [sys.executable, "-m", "inferbus.cli"]
CARD = "4111 1111 1111 1111"


class Platform:
    def __init__(self, state: Path, nats_url: str) -> None:
        self.state = state
        self.nats_url = nats_url

    def creds(self, user: str) -> Path:
        return self.state / "auth" / "creds" / f"{user}.json"

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "INFERBUS_NATS_CREDS": str(self.creds("operator"))}
        return subprocess.run(
            [*INFERBUS, *args], capture_output=True, text=True, timeout=60, env=env
        )


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("secure") / "state"
    nats_port, port = free_ports(2)
    up = subprocess.Popen(
        [
            *INFERBUS,
            "up",
            "--engine",
            "sim",
            "--no-selftest",
            "--port",
            str(port),
            "--nats-port",
            str(nats_port),
            "--state-dir",
            str(state),
            "--metrics-port-base",
            str(metrics_port_base()),
            "--worker-arg=--sim-decode-s-per-step=0.02",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "NATS_URL": ""},
    )
    lines = []
    deadline = time.monotonic() + 60
    assert up.stdout is not None
    while time.monotonic() < deadline:
        line = up.stdout.readline()
        assert line, "inferbus up exited:\n" + "".join(lines)
        lines.append(line)
        if line.startswith("try:"):
            break
    p = Platform(state, f"nats://127.0.0.1:{nats_port}")
    for args in (
        ["--tenant", "acme"],
        ["--tenant", "beta", "--priority", "batch", "--model", "other-model"],
    ):
        made = p.cli("creds", "new", *args, "--state-dir", str(state), "--nats-url", p.nats_url)
        assert made.returncode == 0, made.stderr
    yield p
    up.terminate()
    up.communicate(timeout=60)


async def violation(nc: nats.NATS) -> str:
    """The permissions violation the server reported on this connection, if any."""
    await nc.flush()
    await asyncio.sleep(0.2)
    return str(nc.last_error or "")


async def tenant(p: Platform, name: str) -> Client:
    return await Client.connect(p.nats_url, creds=str(p.creds(f"tenant-{name}")))


def two_tokens(rid: str, reply_to: str) -> RequestSubmitted:
    """A small request as a raw NATS client sends it."""
    return RequestSubmitted(
        request_id=rid,
        model="sim-model",
        prompt="hi",
        reply_to=reply_to,
        created_at=time.time(),
        sampling=SamplingParams(max_tokens=2),
    )


async def terminal_on(sub) -> ReplyEvent:
    """The first terminal event on a reply subscription (chunks skipped)."""
    while not isinstance(
        event := decode((await sub.next_msg(timeout=10)).data, ReplyEvent), Terminal
    ):
        pass  # fmt: skip
    return event


async def test_no_credentials_no_bus(platform: Platform):
    with pytest.raises(BusAuthError):
        await connect(platform.nats_url, "anonymous")
    with pytest.raises(BusAuthError):
        forged = BusCredentials(user="tenant-acme", password="guess", tenant="acme")
        await connect(platform.nats_url, "forged", forged)


async def test_a_tenant_is_served_as_its_record_says_whatever_its_payload_claims(
    platform: Platform,
):
    operator = await connect(platform.nats_url, "op", load_credentials(platform.creds("operator")))
    accepted = await operator.subscribe("ib.req.accepted")
    client = await tenant(platform, "acme")
    try:
        stream = client.stream(
            "sim-model",
            f"/echo pay with {CARD} now",
            max_tokens=40,
            tenant="evil",
            mask_pii=False,
            input_policy="off",
        )
        text = "".join([c.text async for c in stream])
        assert CARD not in text and "****" in text, text  # masked all the same
        seen = decode((await accepted.next_msg(timeout=5)).data, RequestAccepted).request
        assert (seen.tenant, seen.priority, seen.mask_pii) == ("acme", "standard", None)
        assert seen.input_policy == ""  # the deployment's (block), not the payload's "off"
        blocked = client.stream("sim-model", "x' OR '1'='1' --", input_policy="off")
        with pytest.raises(RequestError) as info:
            async for _ in blocked:
                pass
        assert info.value.code == "input_blocked"
    finally:
        await client.close()
        await operator.close()


async def test_a_filtered_stream_ends_once_on_its_reply_subject(platform: Platform):
    """Output masking on (acme's record): the worker's end passes through the sanitizer,
    and the client hears it once. A backup ``stream_interrupted`` sent 5 s after every
    such end reached the reply subject as a second terminal event (issue 42 item 6)."""
    operator = await connect(platform.nats_url, "op", load_credentials(platform.creds("operator")))
    replies = await operator.subscribe(tenant_reply_prefix("acme") + ">")
    client = await tenant(platform, "acme")
    try:
        streams = [
            client.stream("sim-model", f"/echo call {CARD} now {i}", max_tokens=40)
            for i in range(4)
        ]
        ids = {s.request_id for s in streams}

        async def read(stream) -> str:
            return "".join([c.text async for c in stream])

        texts = await asyncio.gather(*(read(s) for s in streams))
        assert all(CARD not in t for t in texts)
        ends: dict[str, list[str]] = {rid: [] for rid in ids}
        # past the worker's filter_backup_s (5 s), and the one more ask (5/3 s) of a
        # worker that woke late on a loaded machine
        deadline = time.monotonic() + 8.0
        while time.monotonic() < deadline:
            try:
                msg = await replies.next_msg(timeout=max(0.01, deadline - time.monotonic()))
            except nats.errors.TimeoutError:
                break
            ev = decode_or_none(msg.data, Terminal)
            if ev is not None and ev.request_id in ids:
                ends[ev.request_id].append(type(ev).__name__)
        assert all(e == ["RequestFinished"] for e in ends.values()), ends
    finally:
        await client.close()
        await operator.close()


async def test_a_tenant_outside_its_scope_is_refused(platform: Platform):
    client = await tenant(platform, "beta")  # may use other-model only
    try:
        with pytest.raises(RequestError) as info:
            async for _ in client.stream("sim-model", "hello"):
                pass
        assert info.value.code == "permission_denied"
    finally:
        await client.close()


@pytest.mark.parametrize(
    "subject",
    [
        "ib.req.submitted",
        "ib.req.submitted.beta",
        "ib.req.accepted",
        "ib.ctl.cancel",
        "ib.ctl.cancel.beta",
        "ib.hb.worker-0.forged",
        "ib.cfg.canary.sim-model",
        "ib.reply.tenant.beta.r1",
        "ib.reply.gw.x.r1",
        "$SRV.INFO",
        "$JS.API.STREAM.DELETE.IB_REQUESTS",
        "$JS.API.STREAM.PURGE.IB_REQUESTS",
        "ib.work.worker-0.abc",
    ],
)
async def test_a_tenant_may_not_publish_beyond_its_own_subjects(platform: Platform, subject: str):
    nc = await connect(platform.nats_url, "acme", load_credentials(platform.creds("tenant-acme")))
    try:
        await nc.publish(subject, b"{}")
        assert "permissions violation for publish" in await violation(nc)
    finally:
        await nc.close()


@pytest.mark.parametrize(
    "subject",
    [
        ">",
        "ib.>",
        "ib.req.>",
        "ib.work.>",
        "ib.filter.>",
        "ib.reply.>",
        "ib.reply.tenant.beta.>",
        "ib.reply.gw.>",
        "_INBOX.>",
        "_INBOX.operator.>",
        "$SRV.>",
    ],
)
async def test_a_tenant_may_not_read_another_s_traffic(platform: Platform, subject: str):
    nc = await connect(platform.nats_url, "acme", load_credentials(platform.creds("tenant-acme")))
    try:
        await nc.subscribe(subject)
        assert "permissions violation for subscription" in await violation(nc)
    finally:
        await nc.close()


async def test_a_tenant_cancels_its_own_requests_only(platform: Platform):
    acme = await tenant(platform, "acme")
    rogue = await connect(
        platform.nats_url, "rogue", load_credentials(platform.creds("tenant-beta"))
    )
    operator = await connect(platform.nats_url, "op", load_credentials(platform.creds("operator")))
    try:
        victim = acme.stream("sim-model", "tell a long story", max_tokens=60)
        first = await victim.__anext__()  # streaming, 20 ms a token: about a second left
        assert first.tokens  # a token was made (its text may still be held back)
        # beta, on its own cancel subject, names acme's request: nothing happens
        await rogue.publish(
            "ib.ctl.cancel.beta",
            encode(CancelRequest(request_id=victim.request_id, reason="hostile")),
        )
        rest = [c async for c in victim]
        assert victim.outcome is not None and victim.outcome.usage.completion_tokens == 60
        assert rest
        # and acme cancelling its own request does cancel it
        ended = await operator.subscribe("ib.req.ended")
        own = acme.stream("sim-model", "another long story", max_tokens=200)
        await own.__anext__()
        await own.cancel("changed my mind")
        while True:
            event = decode((await ended.next_msg(timeout=5)).data, Terminal)
            if event.request_id == tenant_request_id("acme", own.request_id):
                break
        assert isinstance(event, RequestCancelled)
    finally:
        await acme.close()
        await rogue.close()
        await operator.close()


async def test_a_tenant_s_reply_subject_must_be_its_own(platform: Platform):
    """A request that names another tenant's replies is never answered there."""
    acme = await connect(platform.nats_url, "acme", load_credentials(platform.creds("tenant-acme")))
    operator = await connect(platform.nats_url, "op", load_credentials(platform.creds("operator")))
    try:
        beta_replies = await operator.subscribe(tenant_reply_prefix("beta") + ">")
        rid = uuid.uuid4().hex
        req = RequestSubmitted(
            request_id=rid,
            model="sim-model",
            prompt="hi",
            reply_to=tenant_reply_prefix("beta") + rid,
            created_at=time.time(),
        )
        await acme.jetstream().publish("ib.req.submitted.acme", encode(req))
        letter = await letter_about(operator, "sanitizer", rid)
        assert "reply_to" in letter.reason
        with pytest.raises(nats.errors.TimeoutError):
            await beta_replies.next_msg(timeout=0.5)
    finally:
        await acme.close()
        await operator.close()


@pytest.mark.parametrize(
    "target",
    ["ib.cfg.tenant.beta", "$KV.ib-models.current.sim-model", "ib.work.worker-0.x", "ib.dlq.x"],
)
async def test_a_tenant_s_publish_reply_lands_on_no_platform_subject(
    platform: Platform, target: str
):
    """JetStream answers a publish with a PubAck on its NATS reply subject: a tenant
    naming a platform subject there must not get the server to write into a stream
    (issue 42 item 1: aimed at ib.cfg.tenant.<other>, it shut the other tenant out)."""
    acme = await connect(platform.nats_url, "acme", load_credentials(platform.creds("tenant-acme")))
    operator = await connect(platform.nats_url, "op", load_credentials(platform.creds("operator")))
    try:
        js = operator.jetstream()
        stream = await js.find_stream_name_by_subject(target)
        before = (await js.stream_info(stream)).state.messages
        watch = await operator.subscribe(target)
        rid = uuid.uuid4().hex
        req = RequestSubmitted(
            request_id=rid,
            model="sim-model",
            prompt="hi",
            reply_to=tenant_reply_prefix("acme") + rid,
            created_at=time.time(),
        )
        await acme.publish("ib.req.submitted.acme", encode(req), reply=target)
        await acme.publish(
            "ib.ctl.cancel.acme", encode(CancelRequest(request_id=rid)), reply=target
        )
        await acme.flush()
        with pytest.raises(nats.errors.TimeoutError):
            await watch.next_msg(timeout=1.0)
        assert (await js.stream_info(stream)).state.messages == before
    finally:
        await acme.close()
        await operator.close()


@pytest.mark.parametrize("user", ["svc-kvspill", "svc-worker-0", "svc-gateway"])
async def test_a_service_may_not_change_or_add_streams(platform: Platform, user: str):
    """A service's user creates a platform stream that is missing, nothing more: the
    kvspill service's had set IB_DLQ's max_msgs to 1 and made a stream on ib.reply.>
    (issue 42 item 13)."""
    from nats.js.api import StreamConfig

    svc = await connect(platform.nats_url, "rogue", load_credentials(platform.creds(user)))
    operator = await connect(platform.nats_url, "op", load_credentials(platform.creds("operator")))
    try:
        js, op_js = svc.jetstream(), operator.jetstream()
        kept = (await op_js.stream_info("IB_DLQ")).config
        for attempt in (
            js.update_stream(replace_config(kept, max_msgs=1)),
            js.add_stream(StreamConfig(name="TAP", subjects=["ib.reply.>"])),
        ):
            with pytest.raises(Exception):  # noqa: B017 (a timeout or a permission error)
                await asyncio.wait_for(attempt, 3)
        assert (await op_js.stream_info("IB_DLQ")).config.max_msgs == kept.max_msgs
        with pytest.raises(nats.js.errors.NotFoundError):
            await op_js.stream_info("TAP")
        await js.stream_info("IB_REQUESTS")  # reading a stream's state is allowed
    finally:
        await svc.close()
        await operator.close()


def replace_config(config, **changes):
    import dataclasses

    return dataclasses.replace(config, **changes)


async def test_a_reused_request_id_with_a_new_msg_id_is_refused_not_left_waiting(
    platform: Platform,
):
    """Issue 42 item 11: an id reused with a new Nats-Msg-Id within the duplicate
    window was deduplicated at the sanitizer's accepted publish and never answered."""
    acme = await connect(platform.nats_url, "acme", load_credentials(platform.creds("tenant-acme")))
    try:
        js = acme.jetstream()
        rid = uuid.uuid4().hex
        prefix = tenant_reply_prefix("acme") + rid
        first, again = await acme.subscribe(prefix), await acme.subscribe(prefix + "-again")

        headers = {"Nats-Msg-Id": uuid.uuid4().hex}
        await js.publish("ib.req.submitted.acme", encode(two_tokens(rid, prefix)), headers=headers)
        await terminal_on(first)
        headers = {"Nats-Msg-Id": uuid.uuid4().hex}  # a new one: JetStream keeps both
        await js.publish(
            "ib.req.submitted.acme", encode(two_tokens(rid, prefix + "-again")), headers=headers
        )
        answer = decode((await again.next_msg(timeout=10)).data, ReplyEvent)
        assert isinstance(answer, RequestFailed) and answer.code == "duplicate_request"
    finally:
        await acme.close()


async def test_another_tenant_s_request_id_is_neither_told_nor_taken(platform: Platform):
    """Issue 42 item 11: zeta resubmitting acme's id with acme's Nats-Msg-Id got
    ``duplicate: true`` (the id is in use), with a new Nats-Msg-Id ``duplicate_request``;
    and a tenant that submitted an id first had another's request with it refused.
    Tenants' submits have a stream of their own (its duplicate window JetStream's least)
    and each tenant's ids are its own (``<tenant>~<id>`` in the platform)."""
    made = platform.cli(
        "creds", "new", "--tenant", "zeta",
        "--state-dir", str(platform.state), "--nats-url", platform.nats_url,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    nats_of = {}
    for name in ("acme", "zeta"):
        creds = load_credentials(platform.creds(f"tenant-{name}"))
        nats_of[name] = await connect(platform.nats_url, name, creds)

    async def submit(name: str, rid: str, msg_id: str) -> tuple[bool, ReplyEvent]:
        nc = nats_of[name]
        reply = tenant_reply_prefix(name) + rid + "-" + uuid.uuid4().hex[:6]
        replies = await nc.subscribe(reply)
        ack = await nc.jetstream().publish(
            f"ib.req.submitted.{name}",
            encode(two_tokens(rid, reply)),
            headers={"Nats-Msg-Id": msg_id},
        )
        return bool(ack.duplicate), await terminal_on(replies)

    async def served(name: str, rid: str, msg_id: str) -> None:
        duplicate, event = await submit(name, rid, msg_id)
        assert not duplicate, f"{name} was told the id is in use"
        assert isinstance(event, RequestFinished), event
        assert event.request_id == f"{name}~{rid}"
        await asyncio.sleep(0.2)  # past JetStream's least duplicate window (0.1 s)

    try:
        for first, then in (("acme", "zeta"), ("zeta", "acme")):
            rid, msg_id = uuid.uuid4().hex, uuid.uuid4().hex
            await served(first, rid, msg_id)
            await served(then, rid, msg_id)  # the same id and Nats-Msg-Id
            await served(then if first == "acme" else first, uuid.uuid4().hex, msg_id)
        rid = uuid.uuid4().hex
        await served("acme", rid, uuid.uuid4().hex)
        await served("zeta", rid, uuid.uuid4().hex)  # the same id, a new Nats-Msg-Id
        # a tenant's own id reused is still its to be told of
        _, event = await submit("zeta", rid, uuid.uuid4().hex)
        assert isinstance(event, RequestFailed) and event.code == "duplicate_request", event
    finally:
        for nc in nats_of.values():
            await nc.close()


async def test_a_resent_submit_of_an_ended_request_is_answered(platform: Platform):
    """Tenants' submits dedupe for 0.1 s only, so a client's resend of the very same
    submit (its PubAck lost, say) is stored again. Sent after its request ended, its
    accepted event deduplicated against the first and no one answered it."""
    acme = await connect(platform.nats_url, "acme", load_credentials(platform.creds("tenant-acme")))
    try:
        rid = uuid.uuid4().hex
        reply = tenant_reply_prefix("acme") + rid
        replies = await acme.subscribe(reply)
        body = encode(two_tokens(rid, reply))
        ends = []
        for _ in range(2):  # the same bytes, the same Nats-Msg-Id
            await acme.jetstream().publish(
                "ib.req.submitted.acme", body, headers={"Nats-Msg-Id": rid}
            )
            ends.append(await terminal_on(replies))
            await asyncio.sleep(0.2)
        assert isinstance(ends[0], RequestFinished), ends
        assert isinstance(ends[1], RequestFailed) and ends[1].code == "duplicate_request", ends
    finally:
        await acme.close()


async def test_a_malformed_submit_is_answered_on_the_tenant_s_own_replies_only(
    platform: Platform,
):
    """A request too malformed to decode was answered wherever its reply_to said: a
    tenant could put ``invalid_request`` on another tenant's reply subject, ending that
    one's stream for its client (found reviewing issue 42's close)."""
    acme = await connect(platform.nats_url, "acme", load_credentials(platform.creds("tenant-acme")))
    beta = await connect(platform.nats_url, "beta", load_credentials(platform.creds("tenant-beta")))
    try:
        victim = await beta.subscribe(tenant_reply_prefix("beta") + "victim")
        own = await acme.subscribe(tenant_reply_prefix("acme") + "mine")
        for reply in ("beta.victim", "acme.mine"):
            bad = (
                b'{"request_id": "x", "model": 5, "reply_to": "ib.reply.tenant.'
                + reply.encode()
                + b'"}'
            )
            await acme.jetstream().publish("ib.req.submitted.acme", bad)
        answer = decode((await own.next_msg(timeout=10)).data, ReplyEvent)
        assert isinstance(answer, RequestFailed) and answer.code == "invalid_request"
        assert answer.request_id == "acme~x"
        with pytest.raises(nats.errors.TimeoutError):
            await victim.next_msg(timeout=1.0)
    finally:
        await acme.close()
        await beta.close()


async def test_a_worker_speaks_only_for_itself(platform: Platform):
    worker = await connect(
        platform.nats_url, "rogue-worker", load_credentials(platform.creds("svc-worker-0"))
    )
    operator = await connect(platform.nats_url, "op", load_credentials(platform.creds("operator")))
    try:
        forged = WorkerHeartbeat(
            worker_id="worker-9.fake", models=["sim-model"], engine="sim", max_num_seqs=100_000
        )
        # another instance's subject: refused by the server
        await worker.publish("ib.hb.worker-9.fake", encode(forged))
        assert "permissions violation for publish" in await violation(worker)
        # its own subject, another's id: the scheduler refuses it
        await worker.publish("ib.hb.worker-0.fake", encode(forged))
        letter = await letter_about(operator, "scheduler", "worker-9.fake")
        assert "on another's subject" in letter.reason
        # nor may it read another worker's assignments
        js = worker.jetstream()
        with pytest.raises(Exception):  # noqa: B017 (a timeout or a permission error)
            await js.subscribe("ib.work.worker-1.x", stream="IB_WORK")
    finally:
        await worker.close()
        await operator.close()


async def test_the_operator_still_does_its_work(platform: Platform):
    canary = platform.cli("canary", "set", "sim-model", "--nats-url", platform.nats_url)
    assert canary.returncode == 0, canary.stderr
    ps = platform.cli("ps", "--nats-url", platform.nats_url)
    assert ps.returncode == 0 and "worker-0" in ps.stdout, ps.stderr
    gen = platform.cli(
        "generate",
        "--model",
        "sim-model",
        "--max-tokens",
        "4",
        "--nats-url",
        platform.nats_url,
        "hello",
    )
    assert gen.returncode == 0, gen.stderr
    # and without credentials the same command is refused, clearly
    bare = subprocess.run(
        [*INFERBUS, "canary", "set", "sim-model", "--nats-url", platform.nats_url],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "INFERBUS_NATS_CREDS"},
        cwd="/",
    )
    assert bare.returncode != 0 and "refused" in bare.stderr + bare.stdout


def test_creds_new_uses_the_operator_of_the_state_dir_it_names(platform: Platform, tmp_path: Path):
    """``--state-dir DIR`` alone (no INFERBUS_NATS_CREDS, another working folder): it
    wrote the user, then failed Authorization Violation, leaving a user with no record
    (issue 42 item 14). And where the record cannot be published, no user is left."""
    env = {k: v for k, v in os.environ.items() if k != "INFERBUS_NATS_CREDS"}
    state = str(platform.state)

    def creds(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*INFERBUS, "creds", *args],
            capture_output=True,
            text=True,
            timeout=90,
            env=env,
            cwd=tmp_path,
        )

    made = creds("new", "--tenant", "gamma", "--state-dir", state, "--nats-url", platform.nats_url)
    assert made.returncode == 0, made.stderr
    listed = creds("list", "--state-dir", state).stdout
    assert "tenant-gamma" in listed
    (dead,) = free_ports(1)
    failed = creds(
        "new", "--tenant", "delta", "--state-dir", state, "--nats-url", f"nats://127.0.0.1:{dead}"
    )
    assert failed.returncode == 1 and "not made" in failed.stderr, failed.stderr
    assert "tenant-delta" not in creds("list", "--state-dir", state).stdout


async def test_a_tenant_past_its_bytes_per_minute_is_rate_limited(platform: Platform):
    """Issue 42 item 3: a tenant's 50 rejected 1 MB prompts went into the platform in
    2.1 s. Past its record's bytes per minute its submits end ``rate_limited`` at once,
    with when to retry; another tenant is served meanwhile."""
    made = platform.cli(
        "creds", "new", "--tenant", "heavy", "--max-bytes-per-minute", "40000",
        "--state-dir", str(platform.state), "--nats-url", platform.nats_url,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    heavy = await tenant(platform, "heavy")
    calm = await tenant(platform, "acme")
    try:
        codes = []
        for i in range(8):  # 8 x ~10 KB against 40 KB a minute
            try:
                await heavy.generate("sim-model", f"{i} " + "x" * 10_000, max_tokens=2)
                codes.append("ok")
            except RequestError as exc:
                codes.append(exc.code)
                if exc.code == "rate_limited":
                    assert 0 < exc.event.retry_after_s <= 60
        assert codes[:3] == ["ok"] * 3 and codes[-1] == "rate_limited", codes
        assert (await calm.generate("sim-model", "hello", max_tokens=2)).text
    finally:
        await heavy.close()
        await calm.close()


async def test_a_tenant_s_connections_are_bounded_apart_from_others(platform: Platform):
    """Tenants shared one account, so nothing but the server's 64K bounded one tenant's
    connections: it could lock every other client out. Each tenant's account has its
    own limit, and a tenant made while the server runs submits at once (a reload that
    adds an account does not wire its imports: ``creds new`` reloads until it does)."""
    made = platform.cli(
        "creds", "new", "--tenant", "greedy", "--max-connections", "3",
        "--state-dir", str(platform.state), "--nats-url", platform.nats_url,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    creds = load_credentials(made.stdout.strip())
    held = [await connect(platform.nats_url, f"greedy-{i}", creds) for i in range(3)]
    try:
        with pytest.raises(BusAuthError, match="maximum account active connections"):
            await connect(platform.nats_url, "greedy-3", creds, give_up_s=10)
        calm = await tenant(platform, "acme")  # another tenant connects and is served
        try:
            assert (await calm.generate("sim-model", "hello", max_tokens=2)).text
        finally:
            await calm.close()
        await held.pop().close()
        greedy = await Client.connect(platform.nats_url, creds=made.stdout.strip())
        try:  # within its limit again; its account's gates are wired
            assert (await greedy.generate("sim-model", "hello", max_tokens=2)).text
        finally:
            await greedy.close()
    finally:
        for nc in held:
            await nc.close()


async def test_a_cli_command_leaves_the_streams_as_up_sized_them(platform: Platform):
    """`creds new` (as every CLI command that makes sure the streams exist) brought each
    stream to the CLI's own budget (INFERBUS_STREAM_STORE, else 2 GiB), not the one
    `inferbus up` sized them by (a third of its disk's free space), and printed the
    resizing on stdout, where the credentials' path goes."""
    op = await connect(platform.nats_url, "op", load_credentials(platform.creds("operator")))
    try:
        js = op.jetstream()

        async def sizes() -> dict[str, int]:
            return {s.name: (await js.stream_info(s.name)).config.max_bytes for s in STREAMS}

        before = await sizes()
        env = {
            **os.environ,
            "INFERBUS_NATS_CREDS": str(platform.creds("operator")),
            "INFERBUS_STREAM_STORE": "64MiB",  # the CLI's budget is not the platform's
        }
        made = subprocess.run(
            [*INFERBUS, "creds", "new", "--tenant", "sized",
             "--state-dir", str(platform.state), "--nats-url", platform.nats_url],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        assert Path(made.stdout.strip()).exists(), made.stdout  # the path, and nothing else
        assert await sizes() == before
    finally:
        await op.close()


async def test_a_revoked_tenant_is_shut_out(platform: Platform):
    made = platform.cli(
        "creds",
        "new",
        "--tenant",
        "gone",
        "--state-dir",
        str(platform.state),
        "--nats-url",
        platform.nats_url,
    )
    assert made.returncode == 0, made.stderr
    creds = load_credentials(made.stdout.strip())
    nc = await connect(platform.nats_url, "gone", creds)
    await nc.close()
    revoked = platform.cli(
        "creds",
        "revoke",
        "--tenant",
        "gone",
        "--state-dir",
        str(platform.state),
        "--nats-url",
        platform.nats_url,
    )
    assert revoked.returncode == 0, revoked.stderr
    deadline = time.monotonic() + 5
    while True:
        try:
            nc = await connect(platform.nats_url, "gone", creds)
            await nc.close()
        except BusAuthError:
            break
        assert time.monotonic() < deadline, "revoked credentials still connect"
        await asyncio.sleep(0.1)


async def test_the_plain_nats_example_works_as_a_tenant(platform: Platform):
    """docs/examples/nats_client.py (nats-py only) with a tenant's credentials file."""
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "nats_client.py"
    run = subprocess.run(
        [
            sys.executable,
            str(example),
            "--nats-url",
            platform.nats_url,
            "--model",
            "sim-model",
            "--max-tokens",
            "5",
            "--creds",
            str(platform.creds("tenant-acme")),
            "hello",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.split()) == 5
