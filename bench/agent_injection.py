"""Instructions hidden in tool results: inferbus's data checks, its older prompt-only
check of tool messages, and rebuff's heuristic detector, in one run.

    pip install --no-deps rebuff==0.1.1     # only its pure-Python heuristic is used
    python bench/agent_injection.py [--split dev|final] [--show-misses] [--rebuff N] [--pages]

Corpus: bench/corpora/agent_data.jsonl.gz (README there): BIPIA's emails, tables and
code answers, clean and with one instruction inserted at the start, middle or end,
per attack family (a template around a goal; ``bare`` is the goal alone). The dev
split's contexts, goals and templates differ from the final split's; rules may be
read against dev, final only as the aggregates printed here (``--show-misses`` is
refused on it).

Per detector and family: the share of injected texts found (recall) and of clean
texts flagged; then each check's cost in microseconds per KB of tool result, against
the sanitizer's checks of user text (``findings``) on the same texts. rebuff counts a
text as an injection at its default threshold (heuristic score 0.75); it takes 20-40 s
a text of a few KB (it compares every substring with its keyword list), so it runs on
the first ``N`` texts of each family only (``--rebuff N``; 0, the default, skips it).
``--pages`` adds pages an agent fetches as clean data of their own (``pages``): the long
descriptions (READMEs, changelogs) of the installed Python packages, in 1,500-character
pieces, full of orders to a human reader ("install", "delete the cache", "set your API
key"). The last line is JSON.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import importlib.util
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inferbus.services.sanitizer.core import data_check
from inferbus.services.sanitizer.injection import findings

CORPUS = Path(__file__).parent / "corpora" / "agent_data.jsonl.gz"
REBUFF_THRESHOLD = 0.75


def rebuff_heuristic() -> Callable[[str], float] | None:
    """rebuff's ``detect_prompt_injection_using_heuristic_on_input``, loaded from its
    file: the package's ``__init__`` imports langchain and pinecone, which it does not
    need."""
    spec = importlib.util.find_spec("rebuff")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "detect_pi_heuristics.py"
    mod_spec = importlib.util.spec_from_file_location("rebuff_heuristics", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module.detect_prompt_injection_using_heuristic_on_input  # type: ignore[no-any-return]


def rows(split: str) -> list[dict[str, Any]]:
    with gzip.open(CORPUS, "rt") as f:
        return [r for line in f if (r := json.loads(line))["split"] == split]


def package_pages() -> list[dict[str, Any]]:
    """The installed packages' descriptions in 1,500-character pieces, as clean rows."""
    out = []
    for dist in sorted(importlib.metadata.distributions(), key=lambda d: d.metadata["Name"]):
        body = dist.metadata.get_payload() or ""  # type: ignore[attr-defined]
        for i in range(0, min(len(body), 30_000), 1500):
            if len(piece := body[i : i + 1500]) > 300:
                out.append({"family": "pages", "text": piece, "injected": False})
    return out


def us_per_kb(check: Callable[[str], object], texts: list[str], rounds: int = 3) -> float:
    size = sum(len(t.encode()) for t in texts) / 1024
    best = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for t in texts:
            check(t)
        best.append((time.perf_counter() - t0) * 1e6 / size)
    return min(best)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", choices=["dev", "final"], default="dev")
    ap.add_argument("--show-misses", action="store_true")
    ap.add_argument("--rebuff", type=int, default=0, metavar="N")
    ap.add_argument("--pages", action="store_true", help="add package READMEs as clean data")
    args = ap.parse_args()
    if args.show_misses and args.split == "final":
        sys.exit("the final split is read as aggregates only")
    data = rows(args.split) + (package_pages() if args.pages else [])
    rebuff = rebuff_heuristic() if args.rebuff else None
    detectors: dict[str, Callable[[str], bool]] = {
        "inferbus": lambda t: bool(data_check(t)),
        "inferbus-before": lambda t: any(f.type == "prompt_injection" for f in findings(t)),
    }
    if args.rebuff and rebuff is None:
        sys.exit("rebuff is not installed: pip install --no-deps rebuff==0.1.1")
    families = sorted({r["family"] for r in data if r["injected"]})
    if rebuff is not None:
        detectors["rebuff"] = lambda t: rebuff(t) >= REBUFF_THRESHOLD
        seen: Counter[str] = Counter()
        sample = []
        for r in data:
            if seen[r["family"]] < args.rebuff:
                seen[r["family"]] += 1
                sample.append(r)
        data = sample
    total = Counter(r["family"] for r in data)
    hits: dict[str, Counter[str]] = {name: Counter() for name in detectors}
    for r in data:
        for name, detect in detectors.items():
            found = detect(r["text"])
            hits[name][r["family"]] += found
            if args.show_misses and name == "inferbus" and found != r["injected"]:
                what = "MISS" if r["injected"] else "FLAGGED"
                print(what, r["family"], repr(r.get("goal") or r["text"][:200]))
    print(f"split {args.split}: {total['clean']} clean, {len(data) - total['clean']} injected")
    print(f"{'family':20s}" + "".join(f"{n:>18s}" for n in detectors))
    result: dict[str, Any] = {"split": args.split, "detectors": {}}
    for name in detectors:
        injected = sum(total[f] for f in families)
        found = sum(hits[name][f] for f in families)
        result["detectors"][name] = {
            "recall": round(found / injected, 3),
            "recall_without_bare": round(
                sum(hits[name][f] for f in families if f != "bare")
                / sum(total[f] for f in families if f != "bare"),
                3,
            ),
            "clean_flagged": round(hits[name]["clean"] / total["clean"], 4),
            "recall_by_family": {f: round(hits[name][f] / total[f], 3) for f in families},
        }
        if total["pages"]:
            result["detectors"][name]["pages_flagged"] = round(
                hits[name]["pages"] / total["pages"], 4
            )
    for f in [*families, "clean", *(["pages"] if total["pages"] else [])]:
        print(f"{f:20s}" + "".join(f"{hits[n][f]:>10d}/{total[f]:<7d}" for n in detectors))
    texts = [r["text"] for r in data if r["family"] != "pages"]
    cost = {
        "user_text_checks": us_per_kb(findings, texts),
        "data_checks": us_per_kb(data_check, texts),
    }
    if rebuff is not None:
        cost["rebuff"] = us_per_kb(rebuff, texts[:3], rounds=1)
    result["us_per_kb"] = {k: round(v, 1) for k, v in cost.items()}
    result["mean_kb"] = round(statistics.mean(len(t.encode()) for t in texts) / 1024, 2)
    for name, d in result["detectors"].items():
        print(
            f"{name}: recall {d['recall']} ({d['recall_without_bare']} without bare goals), "
            f"clean flagged {d['clean_flagged']}"
            + (f", pages flagged {d['pages_flagged']}" if "pages_flagged" in d else "")
        )
    print("µs per KB: " + ", ".join(f"{k} {v}" for k, v in result["us_per_kb"].items()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
