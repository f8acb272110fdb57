"""The runtime's subscriptions (shared/subscriber.py) on a real nats-server: decoded
for the handler, dead-lettered with the reason when they do not decode or come from
the wrong sender, settled so a bad message is never redelivered, left for redelivery
when the handler fails, settings replayed before the service goes on."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import msgspec
import pytest
from nats.js.api import StreamConfig

from inferbus.contracts import CancelRequest, DeadLetter, dead_letter_subject
from inferbus.shared.bus import DeadLetterer, connect
from inferbus.shared.codec import encode
from inferbus.shared.streams import ensure_consumers, ensure_streams
from inferbus.shared.subscriber import Subscriber
from inferbus.shared.subscriptions import Consume, ConsumerSpec, Follow, Subscription

pytestmark = pytest.mark.integration


class Owner:
    def __init__(self, fail_first: bool = False) -> None:
        self.got: list[tuple[Any, int]] = []
        self.fail_first = fail_first

    async def on(self, event: Any, msg: Any) -> None:
        delivered = msg.metadata.num_delivered if msg.reply else 0
        self.got.append((event, delivered))
        if self.fail_first and delivered == 1:
            raise RuntimeError("a bug in the handler")
        if msg.reply and self.fail_first:
            await msg.ack()


async def eventually(check, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.fixture
async def bus(nats_url):
    nc = await connect(nats_url, "subscriber-test")
    js = nc.jetstream()
    await ensure_streams(js)
    tag = secrets.token_hex(3)
    await js.add_stream(StreamConfig(name=f"T_{tag}", subjects=[f"t.{tag}.>"]))
    service = f"subtest-{tag}"
    letters: list[DeadLetter] = []

    async def on_letter(msg):
        letters.append(msgspec.json.decode(msg.data, type=DeadLetter))

    await nc.subscribe(dead_letter_subject(service), cb=on_letter)
    subs = Subscriber(service, nc, js, DeadLetterer(js, service))
    subs.fields.update(instance="i-0")
    yield nc, js, tag, subs, letters
    await subs.close()
    await js.delete_stream(f"T_{tag}")
    await nc.close()


async def test_decoded_for_the_handler_and_bad_ones_dead_lettered_with_the_reason(bus):
    nc, _, tag, subs, letters = bus
    owner = Owner()
    await subs.open(
        owner,
        [
            Subscription(
                f"c.{tag}.{{instance}}.*",
                CancelRequest,
                "on",
                sender=lambda ev: f"c.{tag}.i-0.{ev.request_id}",
            ),
            Subscription(f"d.{tag}", CancelRequest, "on", bad="drop"),
        ],
    )
    await nc.publish(f"c.{tag}.i-0.r1", encode(CancelRequest(request_id="r1")))
    await nc.publish(f"c.{tag}.i-0.r1", encode(CancelRequest(request_id="r2")))  # not its own
    await nc.publish(f"c.{tag}.i-0.r3", b"{not json")
    await nc.publish(f"d.{tag}", b"{not json")  # dropped: no letter, no call
    await nc.publish(f"d.{tag}", encode(CancelRequest(request_id="r4")))
    await eventually(lambda: len(owner.got) == 2 and len(letters) == 2)
    await asyncio.sleep(0.2)
    assert [ev.request_id for ev, _ in owner.got] == ["r1", "r4"]
    reasons = sorted(letter.reason for letter in letters)
    assert reasons[0] == f"CancelRequest on another's subject (not c.{tag}.i-0.r2)", reasons
    assert reasons[1].startswith("undecodable CancelRequest"), reasons
    assert len(letters) == 2


async def test_a_consumer_settles_bad_messages_and_redelivers_what_a_handler_failed(bus):
    _, js, tag, subs, letters = bus
    spec = ConsumerSpec(
        durable=f"t-{tag}",
        stream=f"T_{tag}",
        filter_subject=f"t.{tag}.work",
        deliver_subject=f"t.deliver.{tag}",
        ack_wait_s=1.0,
    )
    await ensure_consumers(js, [spec])
    owner = Owner(fail_first=True)
    await subs.open(
        owner, [Subscription(spec.filter_subject, CancelRequest, "on", source=Consume(spec))]
    )
    await js.publish(spec.filter_subject, b"{not json")
    await js.publish(spec.filter_subject, encode(CancelRequest(request_id="r1")))
    # the handler fails the first delivery: the message comes back after its ack wait
    await eventually(lambda: [d for _, d in owner.got] == [1, 2], timeout=10)
    await asyncio.sleep(1.5)  # past another ack wait: the bad one was acked, never redelivered
    assert len(letters) == 1 and letters[0].reason.startswith("undecodable CancelRequest")
    info = await js.consumer_info(spec.stream, spec.durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_settings_are_replayed_before_open_returns_then_followed(bus):
    _, js, tag, subs, letters = bus
    # settings streams keep the latest record per subject (IB_CONFIG)
    await js.add_stream(
        StreamConfig(name=f"C_{tag}", subjects=[f"cfg.{tag}.>"], max_msgs_per_subject=1)
    )
    subject = f"cfg.{tag}.*"
    for rid in ("a", "b"):
        await js.publish(f"cfg.{tag}.{rid}", encode(CancelRequest(request_id=rid)))
    await js.publish(f"cfg.{tag}.a", encode(CancelRequest(request_id="a2")))  # the latest of a
    owner = Owner()
    follow = Follow(f"C_{tag}", deliver="last_per_subject", replay=True)
    await subs.open(owner, [Subscription(subject, CancelRequest, "on", source=follow)])
    # before anything else; the follower, live when open returns, may hand the latest
    # records over again (a settings handler takes the same record twice alike)
    assert sorted({ev.request_id for ev, _ in owner.got}) == ["a2", "b"]
    await js.publish(f"cfg.{tag}.c", encode(CancelRequest(request_id="c")))
    await eventually(lambda: "c" in [ev.request_id for ev, _ in owner.got])
    assert letters == []
    await subs.close()
    await js.delete_stream(f"C_{tag}")


async def test_close_keeps_what_a_drain_still_needs(bus):
    nc, _, tag, subs, _ = bus
    intake, output = Owner(), Owner()

    class Both:
        on_intake = intake.on
        on_output = output.on

    await subs.open(
        Both(),
        [
            Subscription(f"in.{tag}", CancelRequest, "on_intake"),
            Subscription(f"out.{tag}", CancelRequest, "on_output"),
        ],
    )
    await subs.close(keep={"on_output"})
    await nc.publish(f"in.{tag}", encode(CancelRequest(request_id="late")))
    await nc.publish(f"out.{tag}", encode(CancelRequest(request_id="still")))
    await eventually(lambda: len(output.got) == 1)
    await asyncio.sleep(0.1)
    assert intake.got == []


async def test_a_handler_that_does_not_exist_fails_the_start(bus):
    _, _, tag, subs, _ = bus
    with pytest.raises(AttributeError):
        await subs.open(Owner(), [Subscription(f"x.{tag}", CancelRequest, "on_missing")])
