"""CRS's regression tests as payload lines: how ``crs_unseen.jsonl`` was made.

    python bench/corpora/extract_crs.py CRS_REPO [--history] [--less crs_attacks.jsonl]

For every test under ``tests/regression/tests/REQUEST-941-*`` (XSS) and ``REQUEST-942-*``
(SQLi) that expects a rule of its file's family to fire: each argument of the URI's
query string and of the body (split at ``&``, the value after the first ``=``,
``unquote_plus``), one JSON line each (``text``, ``kind``, ``rule``, ``commit``,
``label``). ``--history`` reads every version of each file too (``git log --follow``);
``--less`` leaves out the lines another corpus holds.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import urllib.parse
from typing import Any

import yaml

FAMILIES = (
    ("REQUEST-941-APPLICATION-ATTACK-XSS", "xss", "941"),
    ("REQUEST-942-APPLICATION-ATTACK-SQLI", "sqli", "942"),
)


def git(repo: str, *args: str) -> str:
    done = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
    return done.stdout


def expected_ids(output: Any, family: str) -> list[str]:
    if not isinstance(output, dict):
        return []
    log = output.get("log")
    ids = [str(x) for x in log.get("expect_ids") or []] if isinstance(log, dict) else []
    contains = str(output.get("log_contains") or "")
    if isinstance(log, dict):
        contains += " " + str(log.get("log_contains") or "")
    ids += re.findall(r'id "?(\d{6})', contains)
    return [i for i in ids if i.startswith(family)]


def arguments(request: dict[str, Any]) -> list[str]:
    parts: list[str] = []
    uri = str(request.get("uri") or "")
    if "?" in uri:
        parts += uri.split("?", 1)[1].split("&")
    data = request.get("data")
    if isinstance(data, list):
        data = "".join(map(str, data))
    if data:
        parts += str(data).split("&")
    values = [urllib.parse.unquote_plus(p.split("=", 1)[-1]).strip() for p in parts]
    return [v for v in values if v]


def payloads(text: str, family: str) -> list[tuple[str, int]]:
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return []
    out = []
    for test in doc.get("tests") or []:
        for stage in test.get("stages") or []:
            stage = stage.get("stage", stage)
            ids = expected_ids(stage.get("output") or {}, family)
            if ids:
                out += [(v, int(ids[0])) for v in arguments(stage.get("input") or {})]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("repo")
    p.add_argument("--history", action="store_true")
    p.add_argument("--less", action="append", default=[])
    a = p.parse_args()
    held: set[tuple[str, str]] = set()
    for path in a.less:
        with open(path, encoding="utf-8") as f:
            held |= {(r["text"], r["kind"]) for r in map(json.loads, f) if r}
    rows: dict[tuple[str, str], tuple[int, str]] = {}
    for folder, kind, family in FAMILIES:
        tree = git(
            a.repo, "ls-tree", "-r", "--name-only", "HEAD", f"tests/regression/tests/{folder}"
        )
        for path in (f for f in tree.split() if f.endswith(".yaml")):
            commits = git(a.repo, "log", "--format=%H", "--follow", "--", path).split()
            for commit in commits if a.history else commits[:1]:
                for text, rule in payloads(git(a.repo, "show", f"{commit}:{path}"), family):
                    if (text, kind) not in held:
                        rows.setdefault((text, kind), (rule, commit[:9]))
    for (text, kind), (rule, commit) in sorted(
        rows.items(), key=lambda kv: (kv[0][1], kv[1][0], kv[0][0])
    ):
        line = {"text": text, "kind": kind, "rule": rule, "commit": commit, "label": 1}
        print(json.dumps(line, ensure_ascii=False))


if __name__ == "__main__":
    main()
