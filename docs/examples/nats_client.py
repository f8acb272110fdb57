#!/usr/bin/env python3
"""Stream a completion from inferbus over NATS with nothing but nats-py and the stdlib.

    python docs/examples/nats_client.py --nats-url nats://127.0.0.1:4222 \\
        --model sim-model --max-tokens 64 --timeout 30 "Tell me a story"

The text goes to stdout as it arrives; the usage goes to stderr at the end. Exit
status: 0 when the request finished, 1 when it failed or was rejected (stderr says
``error: <code>: <reason>``), 130 when it was cancelled (Ctrl-C sends a cancel).

This file is the reference for clients in other languages: it follows the contract
in docs/nats-api.md step by step (subscribe to a reply subject, publish the request
to JetStream with ``Nats-Msg-Id``, read ``token.chunk`` events until one terminal
event).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import sys
import time
import uuid

import nats

SUBMIT = "ib.req.submitted"  # JetStream: RequestSubmitted
CANCEL = "ib.ctl.cancel"  # core NATS: request.cancel
CANCEL_GRACE_S = 5.0  # how long to wait for request.cancelled after sending a cancel
DEADLINE_GRACE_S = 10.0  # how long past the deadline to wait for the platform's answer

EXIT_OK, EXIT_FAILED, EXIT_CANCELLED = 0, 1, 130


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Stream a completion from inferbus over NATS.")
    p.add_argument("prompt")
    p.add_argument("--nats-url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--model", required=True)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--timeout", type=float, default=0.0, help="seconds; sets the request's deadline (0: none)"
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="send the prompt as one user message instead of a raw prompt",
    )
    p.add_argument("--request-id", default=None, help="default: a fresh random id")
    p.add_argument(
        "--creds",
        default=os.environ.get("INFERBUS_NATS_CREDS", ""),
        help="credentials file on a closed bus (`inferbus creds new --tenant T`): JSON "
        "with user, password and tenant",
    )
    p.add_argument("--tenant", default="default")
    return p.parse_args(argv)


def subject_token(text: str) -> str:
    """One safe subject token: no dots, spaces or wildcards."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", text) or "-"


def build_request(args: argparse.Namespace, request_id: str, reply_to: str) -> dict:
    now = time.time()
    request = {
        "type": "request.submitted",
        "request_id": request_id,
        "model": args.model,
        "reply_to": reply_to,
        "sampling": {
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "seed": args.seed,
        },
        "tenant": args.tenant,
        "created_at": now,
        "deadline": now + args.timeout if args.timeout > 0 else 0.0,
    }
    if args.chat:
        request["messages"] = [{"role": "user", "content": args.prompt}]
    else:
        request["prompt"] = args.prompt
    return request


class Replies:
    """The reading rule of docs/nats-api.md on decoded JSON events: keep the newest
    attempt seen; ignore an older attempt's chunks and its end; a ``resumed`` attempt
    (a stream moved off a lost worker) continues the text, unless the reader has
    chunks past its ``resumed_from`` (then it is a restart). A port of
    ``inferbus.contracts.ReplyReader``, which tests/unit/test_reply_reader.py holds
    it to, event order by event order."""

    def __init__(self) -> None:
        self.attempt = 0  # the newest attempt seen
        self.next_seq = 0  # the chunk expected next from it
        self.lost = 0  # its chunks that never arrived
        self.passed = 0  # chunks handed on since the output (re)started

    def read(self, event: dict) -> tuple[str, bool]:
        """(what to do, whether the output restarts): "text" to write the chunk's
        text, "end" for a terminal event, "skip" for anything else."""
        kind = event.get("type")
        if kind not in ("token.chunk", *TERMINAL):
            return "skip", False  # a type added later
        attempt = event.get("attempt", 1 if kind in ("token.chunk", "request.finished") else 0)
        if 0 < attempt < self.attempt:
            return "skip", False  # a superseded attempt's chunk or end
        restarted = False
        if attempt > self.attempt:
            start = event.get("resumed_from")
            if event.get("resumed") and (start is None or self.next_seq <= start):
                self.attempt = attempt  # a stream moved to another worker: it goes on
            else:
                restarted = self.passed > 0
                self.attempt, self.next_seq, self.lost, self.passed = attempt, 0, 0, 0
        if kind != "token.chunk":
            self.lost += max(0, event.get("chunks", 0) - self.next_seq)
            return "end", restarted
        if event["seq"] < self.next_seq:
            return "skip", restarted  # seen: a moved stream sends its last chunk again
        self.lost += max(0, event["seq"] - self.next_seq)
        self.next_seq = max(self.next_seq, event["seq"] + 1)
        self.passed += 1
        return "text", restarted


TERMINAL = ("request.finished", "request.failed", "request.rejected", "request.cancelled")


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def fail(code: str, reason: str, retryable: bool = False) -> int:
    print(f"error: {code}: {reason}" + (" (retryable)" if retryable else ""), file=sys.stderr)
    return EXIT_FAILED


async def run(args: argparse.Namespace) -> int:
    async def quiet(exc: Exception) -> None:  # connection trouble ends in one error line
        pass

    # on a closed bus: a NATS user and password, inboxes under _INBOX.<user>, and for a
    # tenant its own subjects (its tenant, priority and policies come from its record)
    auth: dict = {}
    tenant = ""
    if args.creds:
        creds = await asyncio.to_thread(read_json, args.creds)
        auth = {
            "user": creds["user"],
            "password": creds["password"],
            "inbox_prefix": f"_INBOX.{creds['user']}",
        }
        tenant = creds.get("tenant", "")
    nc = await nats.connect(
        args.nats_url,
        name="inferbus-nats-example",
        max_reconnect_attempts=3,
        error_cb=quiet,
        **auth,
    )
    js = nc.jetstream()
    loop = asyncio.get_running_loop()
    request_id = args.request_id or uuid.uuid4().hex
    if tenant:
        # the platform knows a tenant's request as <tenant>~<id>, and its events say so
        if not request_id.startswith(f"{tenant}~"):
            request_id = f"{tenant}~{request_id}"
        reply_to = f"ib.reply.tenant.{tenant}.{subject_token(request_id)}"
        submit, cancel_subject = f"{SUBMIT}.{tenant}", f"{CANCEL}.{tenant}"
    else:
        owner = subject_token(f"{socket.gethostname()}-{os.getpid()}")
        reply_to = f"ib.reply.{owner}.{subject_token(request_id)}"
        submit, cancel_subject = SUBMIT, CANCEL

    # 1. subscribe to the reply subject before submitting, so no event is missed
    inbox: asyncio.Queue = asyncio.Queue()

    async def on_reply(msg) -> None:
        inbox.put_nowait(msg)

    sub = await nc.subscribe(reply_to, cb=on_reply)
    written = False  # text on stdout not yet ended by a newline

    def end_line() -> None:
        nonlocal written
        if written:
            sys.stdout.write("\n")
            sys.stdout.flush()
            written = False

    try:
        # 2. submit on JetStream; Nats-Msg-Id = request id makes a resend idempotent
        request = build_request(args, request_id, reply_to)
        headers = {
            "Nats-Msg-Id": request_id,
            "traceparent": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01",
        }
        ack = await js.publish(submit, json.dumps(request).encode(), headers=headers)
        if ack.duplicate:
            return fail(
                "duplicate_request", f"request id {request_id} was already submitted; use a new id"
            )

        # 3. Ctrl-C: ask the platform to stop the request, then wait for its answer
        give_up_at = (
            request["deadline"] + DEADLINE_GRACE_S - time.time() + loop.time()
            if request["deadline"]
            else None
        )
        cancelling = False
        sending: set[asyncio.Task] = set()  # the cancel, held until the loop ends

        def on_sigint() -> None:
            nonlocal give_up_at, cancelling
            if cancelling:
                os._exit(EXIT_CANCELLED)  # a second Ctrl-C: stop waiting
            cancelling = True
            cancel = {
                "type": "request.cancel",
                "request_id": request_id,
                "reason": "cancelled by client",
            }
            sending.add(loop.create_task(nc.publish(cancel_subject, json.dumps(cancel).encode())))
            give_up_at = loop.time() + CANCEL_GRACE_S
            inbox.put_nowait(None)  # wake the reader so it sees the new limit

        loop.add_signal_handler(signal.SIGINT, on_sigint)

        # 4. read events: token.chunk × n, then exactly one terminal event
        replies = Replies()
        while True:
            wait = None if give_up_at is None else max(0.0, give_up_at - loop.time())
            try:
                msg = await asyncio.wait_for(inbox.get(), wait)
            except TimeoutError:
                if cancelling:
                    print("error: cancelled: no answer to the cancel", file=sys.stderr)
                    return EXIT_CANCELLED
                return fail("timeout", "no answer from the platform past the deadline")
            if msg is None:
                continue
            try:
                event = json.loads(msg.data)
            except ValueError:
                continue
            if event.get("request_id") != request_id:
                continue
            action, restarted = replies.read(event)
            if action == "skip":
                continue
            if restarted:
                # a request reassigned after its worker was presumed lost runs again as
                # attempt + 1, from the start: what was written belongs to the older one
                print(f"\nwarning: attempt {replies.attempt} restarts the output", file=sys.stderr)
            kind = event.get("type")
            if action == "text":
                sys.stdout.write(event["text"])
                sys.stdout.flush()
                written = True
            elif kind == "request.finished":
                usage = event.get("usage", {})
                timings = event.get("timings", {})
                if replies.lost:
                    print(
                        f"warning: {event['chunks']} chunks sent, {replies.lost} of them lost",
                        file=sys.stderr,
                    )
                end_line()
                print(
                    f"usage: prompt_tokens={usage.get('prompt_tokens', 0)} "
                    f"completion_tokens={usage.get('completion_tokens', 0)} "
                    f"cached_prompt_tokens={usage.get('cached_prompt_tokens', 0)} "
                    f"finish_reason={event.get('finish_reason')} "
                    f"first_token_s={timings.get('first_token_s', 0.0):.3f}",
                    file=sys.stderr,
                )
                return EXIT_OK
            elif kind in ("request.failed", "request.rejected"):
                end_line()
                where = f" (param {event['param']})" if event.get("param") else ""
                return fail(
                    event.get("code", "unknown"),
                    event.get("reason", "") + where,
                    bool(event.get("retryable")),
                )
            elif kind == "request.cancelled":
                end_line()
                print(f"cancelled: {event.get('reason', '')}", file=sys.stderr)
                return EXIT_CANCELLED
    finally:
        end_line()
        loop.remove_signal_handler(signal.SIGINT)
        await sub.unsubscribe()
        await nc.drain()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(run(args))
    except (OSError, nats.errors.Error) as exc:  # no server, no stream, ...
        return fail("nats_error", f"{type(exc).__name__}: {exc} ({args.nats_url})")


if __name__ == "__main__":
    sys.exit(main())
