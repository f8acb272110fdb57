"""Valid PII made up on the spot (Faker-style), for tests and the PII benchmark:
numbers that pass the checks real ones pass (Luhn, GB 11643, mod 97, SSA rules), in
the formats people write them."""

from __future__ import annotations

import random
import string

from inferbus.services.sanitizer.pii import luhn_ok

_GB11643_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)


def _luhn_complete(prefix: str) -> str:
    for d in "0123456789":
        if luhn_ok(prefix + d):
            return prefix + d
    raise AssertionError("unreachable")


def card_number(rng: random.Random) -> str:
    brand = rng.choice(
        [("4", 16), ("51", 16), ("37", 15), ("6011", 16), ("62", 19), ("35", 16), ("4", 13)]
    )
    body = brand[0] + "".join(
        rng.choice(string.digits) for _ in range(brand[1] - 1 - len(brand[0]))
    )
    number = _luhn_complete(body)
    style = rng.choice(["plain", "space", "dash"]) if len(number) == 16 else "plain"
    if style == "plain":
        return number
    sep = " " if style == "space" else "-"
    return sep.join(number[i : i + 4] for i in range(0, 16, 4))


def cn_id(rng: random.Random) -> str:
    region = rng.choice(["110105", "310104", "440305", "510107", "330106"])
    year = rng.randint(1950, 2010)
    month = rng.randint(1, 12)
    day = rng.randint(1, 28)
    body = f"{region}{year}{month:02d}{day:02d}{rng.randint(0, 999):03d}"
    s = sum(int(c) * w for c, w in zip(body, _GB11643_WEIGHTS, strict=True))
    return body + "10X98765432"[s % 11]


def cn_mobile(rng: random.Random) -> str:
    number = rng.choice("3456789") + "".join(rng.choice(string.digits) for _ in range(9))
    number = "1" + number
    style = rng.randint(0, 3)
    if style == 0:
        return number
    if style == 1:
        return f"+86 {number[:3]} {number[3:7]} {number[7:]}"
    if style == 2:
        return f"+86{number}"
    return f"{number[:3]}-{number[3:7]}-{number[7:]}"


def us_phone(rng: random.Random) -> str:
    area = rng.randint(201, 989)
    mid = rng.randint(200, 999)
    last = rng.randint(0, 9999)
    return rng.choice(
        [
            f"({area}) {mid}-{last:04d}",
            f"{area}-{mid}-{last:04d}",
            f"+1 {area} {mid} {last:04d}",
            f"{area}.{mid}.{last:04d}",
            f"+44 20 {rng.randint(7000, 8999)} {last:04d}",
        ]
    )


def email(rng: random.Random) -> str:
    user = rng.choice(["john", "li.wei", "a.smith", "ops-team", "zhang_san", "m"]) + str(
        rng.randint(0, 99)
    )
    return f"{user}@{rng.choice(['example.com', 'mail.example.cn', 'corp.io', 'qq.com'])}"


def iban(rng: random.Random) -> str:
    country, length = rng.choice([("DE", 22), ("GB", 22), ("FR", 27), ("NL", 18), ("ES", 24)])
    if country == "GB":
        bban = "".join(rng.choice(string.ascii_uppercase) for _ in range(4)) + "".join(
            rng.choice(string.digits) for _ in range(14)
        )
    elif country == "NL":
        bban = "".join(rng.choice(string.ascii_uppercase) for _ in range(4)) + "".join(
            rng.choice(string.digits) for _ in range(10)
        )
    else:
        bban = "".join(rng.choice(string.digits) for _ in range(length - 4))
    numeric = "".join(str(int(c, 36)) for c in bban + country + "00")
    check = 98 - int(numeric) % 97
    compact = f"{country}{check:02d}{bban}"
    if rng.random() < 0.5:
        return compact
    return " ".join(compact[i : i + 4] for i in range(0, len(compact), 4))


def ipv4(rng: random.Random) -> str:
    return ".".join(str(rng.randint(1 if i == 0 else 0, 255)) for i in range(4))


def ssn(rng: random.Random) -> str:
    area = rng.choice([a for a in range(1, 900) if a != 666])
    return f"{area:03d}-{rng.randint(1, 99):02d}-{rng.randint(1, 9999):04d}"


GENERATORS = {
    "CREDIT_CARD": card_number,
    "CN_ID_CARD": cn_id,
    "PHONE": cn_mobile,
    "EMAIL": email,
    "IBAN": iban,
    "IP_ADDRESS": ipv4,
    "US_SSN": ssn,
}


def _fullwidth(value: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in value)


def obfuscated(kind: str, value: str, rng: random.Random) -> str:
    """``value`` written the way people slip it past filters: fullwidth digits, a
    zero-width space or a line break between a card's groups, one digit at a time,
    an email's "@" and "." written out in brackets."""
    if kind == "EMAIL":
        at, dot = rng.choice([(" [at] ", " [dot] "), ("(at)", "(dot)"), (" {at} ", " {dot} ")])
        local, _, domain = value.partition("@")
        return local + at + domain.replace(".", dot)
    if kind == "CREDIT_CARD":
        digits = "".join(c for c in value if c.isdigit())
        groups = [digits[i : i + 4] for i in range(0, len(digits), 4)]
        return rng.choice(
            [
                lambda: _fullwidth(" ".join(groups)),
                lambda: "\u200b".join(groups),
                lambda: " ".join(groups[:2]) + "\n" + " ".join(groups[2:]),
                lambda: digits[:8] + "\n" + digits[8:],
                lambda: " ".join(digits),
            ]
        )()
    if kind in ("PHONE", "CN_ID_CARD", "US_SSN", "IP_ADDRESS", "IBAN"):
        return _fullwidth(value)
    return value
