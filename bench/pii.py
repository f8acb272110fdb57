"""PII detection: inferbus against Microsoft Presidio's pattern recognizers, one run.

A labelled set is generated (seeded): English and Chinese sentences holding every
entity type in the formats people write them (tests/testkit/piidata.py makes numbers that
pass the real checks), a fifth of them obfuscated (fullwidth digits, a zero-width space
or a line break inside a card number, spaced digits, "bob [at] example [dot] com", an
address glued to Latin letters as in "登录IP1.2.3.4"), and hard negatives that look
like them (order numbers and 16-digit ids failing Luhn, timestamps, version strings,
18-digit numbers with a wrong check digit, invalid IBANs, out-of-range addresses).
Both detectors see the same texts; a detection counts when it overlaps a labelled
entity of the same type.

Presidio runs with a blank spaCy pipeline (no NER model can be downloaded), its
predefined recognizers for our types (credit card, email, IBAN, IP, phone with CN
added to its regions, US SSN) and a pattern recognizer for Chinese ID numbers, which
it lacks.

    pip install presidio-analyzer      # not a project dependency
    python bench/pii.py [--texts 2000] [--seed 0] [--stream-requests 40]

Prints precision, recall and F1 per entity type and overall, throughput (MB/s of
UTF-8 text) for both, and the latency inferbus adds per token chunk in a stream
(StreamMasker.feed and the sanitizer's FilteredStream.on_event, 3-character chunks).
Then, on a running platform (``inferbus up --engine sim`` paced at 2 ms a token), the
latency the filter adds in the stream, end to end: the same requests (same prompt and
seed, so the same text) with masking on and off through the NATS client, and for each
character of output the difference between the times it reached the client; the
median is what masking adds per chunk (the sanitizer hop plus what it held back).
The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import testkit_path  # noqa: F401  (before testkit)
from testkit.piidata import GENERATORS, obfuscated, us_phone

from inferbus.contracts import TokenChunk
from inferbus.services.sanitizer.core import FilteredStream
from inferbus.services.sanitizer.pii import StreamMasker, mask

TYPES = ("CREDIT_CARD", "CN_ID_CARD", "PHONE", "EMAIL", "IBAN", "IP_ADDRESS", "US_SSN")

EN = [
    "Please charge {} for the order.",
    "My contact is {}, call anytime.",
    "The server at {} went down last night.",
    "Send the invoice to {} by Friday.",
    "Wire the money to {} and confirm.",
    "Her SSN {} was on the form.",
    "Customer {} asked for a refund; ticket 48213 is open.",
    "Use {} for the account.",
    "Login from IP{} failed three times.",
]
ZH = [
    "请用{}付款。",
    "我的手机号是{}，有事打电话。",
    "身份证号码{}已登记。",
    "服务器{}昨晚宕机了。",
    "请把发票发到{}。",
    "收款账户{}，请尽快转账。",
    "客户{}申请退款，工单号48213。",
    "登录IP{}异常。",
]
NEGATIVES = [
    lambda r: f"Order {_non_luhn(r)} shipped on 2023-11-16 18:17:03.",
    lambda r: f"订单号{_non_luhn(r)}已发货，时间2023-11-16 18:17:03。",
    lambda r: (
        f"Upgrade to v{r.randint(1, 9)}.{r.randint(0, 20)}.{r.randint(0, 99)}.{r.randint(0, 9)} "
        f"or 1.{r.randint(0, 9)}.{r.randint(0, 9)}.{r.randint(0, 9)}.{r.randint(0, 9)} today."
    ),
    lambda r: f"Tracking {r.randint(10**11, 10**12 - 1)}, unix time {r.randint(1.6e12, 1.8e12)}.",
    lambda r: f"编号{_bad_cn_id(r)}无效。",
    lambda r: f"IBAN DE{r.randint(10, 99)} 3704 0044 0532 0130 0{r.randint(0, 9)} is a typo.",
    lambda r: f"The address 256.{r.randint(0, 255)}.1.1 is not valid, nor is 10.0.0.",
    lambda r: f"Price 1,234.56, ratio 3.14159, count {r.randint(100, 99999)}.",
    lambda r: f"SSN 000-{r.randint(10, 99)}-{r.randint(1000, 9999)} is never issued.",
]


OBFUSCATED_SHARE = 0.2
"""Entities written to slip past filters (fullwidth digits, zero-width spaces or a line
break inside a card number, spaced digits, "[at]" and "[dot]"): testkit.piidata.obfuscated."""


def _non_luhn(r: random.Random) -> str:
    from inferbus.services.sanitizer.pii import luhn_ok

    while True:
        n = "4" + "".join(str(r.randint(0, 9)) for _ in range(15))
        if not luhn_ok(n):
            return n


def _bad_cn_id(r: random.Random) -> str:
    cid = GENERATORS["CN_ID_CARD"](r)
    return cid[:-1] + ("0" if cid[-1] != "0" else "1")


def labelled(n: int, seed: int) -> list[tuple[str, list[tuple[str, int, int]]]]:
    r = random.Random(seed)
    out = []
    for i in range(n):
        if i % 4 == 3:
            out.append((r.choice(NEGATIVES)(r), []))
            continue
        spans, parts, at = [], [], 0
        for _ in range(r.randint(1, 3)):
            kind = r.choice(TYPES)
            value = us_phone(r) if kind == "PHONE" and r.random() < 0.5 else GENERATORS[kind](r)
            if r.random() < OBFUSCATED_SHARE:
                value = obfuscated(kind, value, r)
            template = r.choice(ZH if r.random() < 0.5 else EN)
            if "IP{}" in template and kind != "IP_ADDRESS":
                template = template.replace("IP{}", "{}")
            head, tail = template.split("{}")
            sentence = head + value + tail + " "
            spans.append((kind, at + len(head), at + len(head) + len(value)))
            parts.append(sentence)
            at += len(sentence)
        out.append(("".join(parts), spans))
    return out


# -- the two detectors --------------------------------------------------------------------


def inferbus_detect(text: str) -> list[tuple[str, int, int]]:
    return [(e.type, e.start, e.end) for e in mask(text)[1]]


def presidio_detector() -> Callable[[str], list[tuple[str, int, int]]]:
    import logging

    import spacy
    from presidio_analyzer import AnalyzerEngine, Pattern, PatternRecognizer, RecognizerRegistry
    from presidio_analyzer.nlp_engine import SpacyNlpEngine
    from presidio_analyzer.predefined_recognizers import (
        CreditCardRecognizer,
        EmailRecognizer,
        IbanRecognizer,
        IpRecognizer,
        PhoneRecognizer,
        UsSsnRecognizer,
    )

    class BlankSpacy(SpacyNlpEngine):
        def load(self) -> None:
            self.nlp = {"en": spacy.blank("en")}

    # its email check asks the internet for the public suffix list, then falls back
    logging.getLogger("tldextract").setLevel(logging.CRITICAL)
    engine = BlankSpacy(models=[{"lang_code": "en", "model_name": "blank"}])
    engine.load()
    registry = RecognizerRegistry()
    for rec in (
        CreditCardRecognizer(),
        EmailRecognizer(),
        IbanRecognizer(),
        IpRecognizer(),
        PhoneRecognizer(supported_regions=("US", "UK", "DE", "CN", "FR")),
        UsSsnRecognizer(),
    ):
        registry.add_recognizer(rec)
    registry.add_recognizer(
        PatternRecognizer(
            supported_entity="CN_ID_CARD",
            patterns=[Pattern("cn_id", r"(?<!\d)\d{17}[\dXx](?![\dXx])", 0.6)],
        )
    )
    analyzer = AnalyzerEngine(registry=registry, nlp_engine=engine, supported_languages=["en"])
    names = {
        "CREDIT_CARD": "CREDIT_CARD",
        "EMAIL_ADDRESS": "EMAIL",
        "IBAN_CODE": "IBAN",
        "IP_ADDRESS": "IP_ADDRESS",
        "PHONE_NUMBER": "PHONE",
        "US_SSN": "US_SSN",
        "CN_ID_CARD": "CN_ID_CARD",
    }
    wanted = list(names)

    def detect(text: str) -> list[tuple[str, int, int]]:
        return [
            (names[r.entity_type], r.start, r.end)
            for r in analyzer.analyze(text, language="en", entities=wanted)
            if r.entity_type in names
        ]

    return detect


# -- scoring ------------------------------------------------------------------------------


def score(
    data: list[tuple[str, list[tuple[str, int, int]]]],
    detect: Callable[[str], list[tuple[str, int, int]]],
) -> dict[str, Any]:
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    t0 = time.perf_counter()
    found = [detect(text) for text, _ in data]
    seconds = time.perf_counter() - t0

    def overlaps(a: tuple[str, int, int], b: tuple[str, int, int]) -> bool:
        return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]

    for (_text, gold), pred in zip(data, found, strict=True):
        for g in gold:
            (tp if any(overlaps(g, p) for p in pred) else fn)[g[0]] += 1
        for p in pred:
            if not any(overlaps(p, g) for g in gold):
                fp[p[0]] += 1
    size = sum(len(t.encode()) for t, _ in data)

    def prf(t: int, f_p: int, f_n: int) -> tuple[float, float, float]:
        p = t / (t + f_p) if t + f_p else 1.0
        r = t / (t + f_n) if t + f_n else 1.0
        return p, r, (2 * p * r / (p + r) if p + r else 0.0)

    per = {k: prf(tp[k], fp[k], fn[k]) for k in TYPES}
    total = prf(sum(tp.values()), sum(fp.values()), sum(fn.values()))
    return {"per_type": per, "overall": total, "mb_per_s": size / seconds / 1e6, "seconds": seconds}


def chunk_latency(data: list[tuple[str, list[Any]]]) -> dict[str, float]:
    feed_ns: list[int] = []
    event_ns: list[int] = []
    clock = time.perf_counter_ns
    for text, _ in data:
        masker = StreamMasker()
        stream = FilteredStream("r", "c", 0.0)
        for i in range(0, len(text), 3):
            piece = text[i : i + 3]
            t0 = clock()
            masker.feed(piece)
            t1 = clock()
            stream.on_event(TokenChunk(request_id="r", seq=i, text=piece, token_ids=[1]), 0.0)
            t2 = clock()
            feed_ns.append(t1 - t0)
            event_ns.append(t2 - t1)
    q = statistics.quantiles
    return {
        "feed_p50_us": statistics.median(feed_ns) / 1e3,
        "feed_p99_us": q(feed_ns, n=100)[98] / 1e3,
        "event_p50_us": statistics.median(event_ns) / 1e3,
        "event_p99_us": q(event_ns, n=100)[98] / 1e3,
    }


async def _arrivals(client: Any, prompt: str, mask_pii: bool) -> list[float]:
    """When each character of the output reached the client, from submission."""
    t0 = time.perf_counter()
    times: list[float] = []
    async for c in client.stream("sim-model", prompt, max_tokens=64, seed=1, mask_pii=mask_pii):
        now = time.perf_counter() - t0
        times += [now] * len(c.text)
    return times


async def _stream_added(nats_url: str, n: int) -> dict[str, float]:
    from inferbus.client import Client

    client = await Client.connect(nats_url)
    added: list[float] = []
    try:
        for i in range(n):
            prompt = f"stream latency probe {i}"
            pair = {}
            for mask_pii in (True, False) if i % 2 else (False, True):  # alternate order
                pair[mask_pii] = await _arrivals(client, prompt, mask_pii)
            on, off = pair[True], pair[False]
            added += [a - b for a, b in zip(on, off, strict=False)]
    finally:
        await client.close()
    return {
        "stream_added_p50_us": statistics.median(added) * 1e6,
        "stream_added_p90_us": statistics.quantiles(added, n=10)[8] * 1e6,
    }


def stream_added(n: int) -> dict[str, float]:
    import asyncio
    import tempfile
    from pathlib import Path

    from platform_up import start_up

    with tempfile.TemporaryDirectory() as tmp:
        up, nats_url, _ = start_up(
            Path(tmp), "--engine", "sim", "--worker-arg=--sim-decode-s-per-step=0.002"
        )
        try:
            return asyncio.run(_stream_added(nats_url, n))
        finally:
            up.send_signal(2)
            up.wait(60)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--texts", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--stream-requests",
        type=int,
        default=40,
        help="pairs of requests for the in-stream latency (0: skip it)",
    )
    a = p.parse_args()
    data = labelled(a.texts, a.seed)
    presidio = presidio_detector()
    ours = score(data, inferbus_detect)
    theirs = score(data, presidio)
    latency = chunk_latency(data)
    if a.stream_requests:
        latency.update(stream_added(a.stream_requests))
    n_entities = sum(len(g) for _, g in data)
    print(
        f"\n{len(data)} texts (English and Chinese), {n_entities} entities, "
        f"{sum(1 for _, g in data if not g)} hard-negative texts\n"
    )
    print(f"{'type':<14}{'inferbus P/R/F1':>22}{'presidio P/R/F1':>22}")
    for k in TYPES:
        o, t = ours["per_type"][k], theirs["per_type"][k]
        print(f"{k:<14}{o[0]:>8.3f}{o[1]:>7.3f}{o[2]:>7.3f}{t[0]:>8.3f}{t[1]:>7.3f}{t[2]:>7.3f}")
    o, t = ours["overall"], theirs["overall"]
    print(
        f"{'overall':<14}{o[0]:>8.3f}{o[1]:>7.3f}{o[2]:>7.3f}{t[0]:>8.3f}{t[1]:>7.3f}{t[2]:>7.3f}"
    )
    ratio = ours["mb_per_s"] / theirs["mb_per_s"]
    print(
        f"\nthroughput: inferbus {ours['mb_per_s']:.2f} MB/s, presidio "
        f"{theirs['mb_per_s']:.3f} MB/s: {ratio:.0f}x"
    )
    print(
        f"per token chunk (3 chars): StreamMasker.feed p50 {latency['feed_p50_us']:.1f} µs "
        f"(p99 {latency['feed_p99_us']:.1f}); sanitizer filter event p50 "
        f"{latency['event_p50_us']:.1f} µs (p99 {latency['event_p99_us']:.1f})"
    )
    if "stream_added_p50_us" in latency:
        print(
            f"in the stream, end to end (masking on vs off, same text): "
            f"+{latency['stream_added_p50_us']:.0f} µs p50, "
            f"+{latency['stream_added_p90_us']:.0f} µs p90 per character"
        )
    print(
        json.dumps(
            {
                "bench": "pii",
                "texts": len(data),
                "entities": n_entities,
                "inferbus": {
                    "precision": round(o[0], 4),
                    "recall": round(o[1], 4),
                    "f1": round(o[2], 4),
                    "mb_per_s": round(ours["mb_per_s"], 3),
                    "f1_by_type": {k: round(v[2], 4) for k, v in ours["per_type"].items()},
                },
                "presidio": {
                    "precision": round(t[0], 4),
                    "recall": round(t[1], 4),
                    "f1": round(t[2], 4),
                    "mb_per_s": round(theirs["mb_per_s"], 4),
                    "f1_by_type": {k: round(v[2], 4) for k, v in theirs["per_type"].items()},
                },
                "throughput_ratio": round(ratio, 1),
                "chunk_latency_us": {k: round(v, 2) for k, v in latency.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
