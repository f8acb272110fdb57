"""Input checks on public corpora and the development set, inferbus and libinjection in
one run.

    pip install libinjection-python          # in the dev extra
    python bench/injection.py [--split final|dev|all] [--show-misses]

Corpora (bench/corpora/, README there), each split in two by a hash of the text
(tests/testkit/corpora.py): rules may be tuned on ``dev``; ``final`` is read only for
the figures a change reports.

- OWASP CRS's own regression payloads for its SQLi (942xxx) and XSS (941xxx) rules:
  recall per kind, on every line and on lines of 8 characters or more; and those of
  its tests (now and in their git history) that corpus lacks ("unseen").
- PayloadsAllTheThings' SQLi and XSS intruder lists: a second source of payloads,
  by other authors (recall per kind).
- OWASP's XSS Filter Evasion Cheat Sheet's vectors (recall).
- SecLists' XSS lists, less what the corpora above hold (recall).
- awesome-chatgpt-prompts (ordinary prompts, role-play and "act as a SQL terminal"
  ones included): the share of benign prompts blocked, and its jailbreaks found.
- short inputs, most with no prose in them (Spider's SQL queries and questions,
  tldr-pages' shell commands): the share blocked, where the stricter rules for
  fragments apply.
- bench/injection_devset.py: payloads in their common and encoded variants and
  benign questions about code (not split: it is what the rules are developed on).

libinjection is the detector behind CRS rules 942100 and 941100; it is run on every
text as SQLi or XSS. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import libinjection
import testkit_path  # noqa: F401  (before testkit)
from injection_devset import devset
from testkit.corpora import (
    Line,
    Split,
    chatgpt_prompts,
    crs_attacks,
    crs_unseen,
    owasp_xss_evasion,
    payloads_all_the_things,
    seclists_xss,
    short_inputs,
)

from inferbus.services.sanitizer.injection import findings


def inferbus(text: str) -> bool:
    return bool(findings(text))


def libinjection_detect(text: str) -> bool:
    return bool(
        libinjection.is_sql_injection(text)["is_sqli"] or libinjection.is_xss(text)["is_xss"]
    )


DETECTORS: dict[str, Callable[[str], bool]] = {
    "inferbus": inferbus,
    "libinjection": libinjection_detect,
}


def share(lines: list[Line], detect: Callable[[str], bool]) -> float:
    return sum(detect(x["text"]) for x in lines) / len(lines) if lines else 0.0


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--split", choices=["final", "dev", "all"], default="final")
    p.add_argument("--show-misses", action="store_true", help="inferbus's, on the dev set")
    a = p.parse_args()
    split: Split = a.split
    result: dict[str, dict[str, float]] = {name: {} for name in DETECTORS}
    crs = crs_attacks(split)
    unseen = crs_unseen(split)
    prompts = chatgpt_prompts(split)
    benign = [x for x in prompts if x["label"] == 0]
    jailbreaks = [x for x in prompts if x["label"] == 1]
    short = short_inputs(split)
    patt = payloads_all_the_things(split)
    owasp = owasp_xss_evasion(split)
    seclists = seclists_xss(split)
    rows = devset()
    payloads = [
        Line(text=r["text"], kind=r["type"], label=1) for r in rows if r["label"] == "payload"
    ]
    dev_benign = [
        Line(text=r["text"], kind="benign", label=0) for r in rows if r["label"] != "payload"
    ]
    t0 = time.perf_counter()
    for name, detect in DETECTORS.items():
        for kind in ("sqli", "xss"):
            lines = [x for x in crs if x["kind"] == kind]
            result[name][f"crs_{kind}"] = share(lines, detect)
            result[name][f"crs_{kind}_len8"] = share(
                [x for x in lines if len(x["text"]) >= 8], detect
            )
        for kind in ("sqli", "xss"):
            lines = [x for x in unseen if x["kind"] == kind]
            result[name][f"crs_unseen_{kind}"] = share(lines, detect)
        for kind in ("sqli", "xss"):
            result[name][f"patt_{kind}"] = share([x for x in patt if x["kind"] == kind], detect)
        result[name]["owasp_xss"] = share(owasp, detect)
        result[name]["seclists_xss"] = share(seclists, detect)
        result[name]["benign_blocked"] = share(benign, detect)
        result[name]["short_blocked"] = share(short, detect)
        result[name]["jailbreaks_found"] = share(jailbreaks, detect)
        result[name]["devset_recall"] = share(payloads, detect)
        result[name]["devset_benign_blocked"] = share(dev_benign, detect)
    seconds = time.perf_counter() - t0
    n_sqli = sum(x["kind"] == "sqli" for x in crs)
    print(
        f"split {split}: CRS {n_sqli} SQLi + {len(crs) - n_sqli} XSS payloads "
        f"(unseen: {sum(x['kind'] == 'sqli' for x in unseen)} + "
        f"{sum(x['kind'] == 'xss' for x in unseen)}), "
        f"{len(benign)} ordinary prompts + {len(jailbreaks)} jailbreaks, "
        f"{len(short)} short inputs, {len(patt)} PayloadsAllTheThings payloads, "
        f"{len(owasp)} OWASP XSS vectors, {len(seclists)} SecLists XSS payloads; "
        f"dev set {len(payloads)} payloads + {len(dev_benign)} benign"
    )
    print(f"{'':<34}{'inferbus':>10}{'libinjection':>14}{'ratio':>8}")
    for key, label in (
        ("crs_sqli", "CRS SQLi recall"),
        ("crs_sqli_len8", "CRS SQLi recall (len >= 8)"),
        ("crs_xss", "CRS XSS recall"),
        ("crs_xss_len8", "CRS XSS recall (len >= 8)"),
        ("crs_unseen_sqli", "CRS unseen SQLi recall"),
        ("crs_unseen_xss", "CRS unseen XSS recall"),
        ("patt_sqli", "PayloadsAllTheThings SQLi recall"),
        ("patt_xss", "PayloadsAllTheThings XSS recall"),
        ("owasp_xss", "OWASP XSS evasion recall"),
        ("seclists_xss", "SecLists XSS recall"),
        ("benign_blocked", "ordinary prompts blocked"),
        ("short_blocked", "short inputs blocked"),
        ("jailbreaks_found", "jailbreak prompts found"),
        ("devset_recall", "dev set recall"),
        ("devset_benign_blocked", "dev set benign blocked"),
    ):
        ours, theirs = result["inferbus"][key], result["libinjection"][key]
        ratio = f"{ours / theirs:.2f}x" if theirs else "-"
        print(f"{label:<34}{ours:>10.3f}{theirs:>14.3f}{ratio:>8}")
    print(f"({seconds:.1f} s for both detectors)")
    if a.show_misses:
        for x in payloads:
            if not inferbus(x["text"]):
                print("MISS", x["kind"], repr(x["text"]))
        for x in dev_benign:
            if inferbus(x["text"]):
                print("BLOCKED", repr(x["text"]))
    print(
        json.dumps(
            {
                "bench": "injection",
                "split": split,
                **{name: {k: round(v, 4) for k, v in r.items()} for name, r in result.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
