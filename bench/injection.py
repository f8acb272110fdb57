"""Input checks on the labelled development set: precision and recall per type.

    python bench/injection.py [--show-misses]

The set (bench/injection_devset.py) holds payloads in their common variants (bare,
upper/lower case, after a field label, inside a sentence) and benign prompts,
including questions about SQL, HTML and JavaScript. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from injection_devset import devset

from inferbus.services.sanitizer.injection import findings


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--show-misses", action="store_true")
    a = p.parse_args()
    rows = devset()
    counts: Counter[tuple[str, str]] = Counter()
    t0 = time.perf_counter()
    for r in rows:
        hit = bool(findings(r["text"]))
        truth = r["label"] == "payload"
        outcome = "tp" if hit and truth else "fp" if hit else "fn" if truth else "tn"
        counts[(r["type"], outcome)] += 1
        if a.show_misses and outcome in ("fp", "fn"):
            print(outcome.upper(), r["type"], repr(r["text"]))
    seconds = time.perf_counter() - t0
    tp = sum(v for (_, o), v in counts.items() if o == "tp")
    fp = sum(v for (_, o), v in counts.items() if o == "fp")
    fn = sum(v for (_, o), v in counts.items() if o == "fn")
    tn = sum(v for (_, o), v in counts.items() if o == "tn")
    print(f"{len(rows)} texts: {tp + fn} payloads, {fp + tn} benign")
    print(f"{'type':<18}{'payloads':>10}{'recall':>9}")
    per_type = {}
    for kind in ("sql_injection", "xss", "prompt_injection"):
        hit, miss = counts[(kind, "tp")], counts[(kind, "fn")]
        per_type[kind] = round(hit / (hit + miss), 4)
        print(f"{kind:<18}{hit + miss:>10}{per_type[kind]:>9.3f}")
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    print(
        f"precision {precision:.3f}  recall {recall:.3f}  "
        f"({fp} benign flagged, {fn} payloads missed; {seconds / len(rows) * 1e6:.0f} µs a text)"
    )
    print(
        json.dumps(
            {
                "bench": "injection",
                "texts": len(rows),
                "precision": round(precision, 4),
                "recall": round(recall, 4),
                "recall_by_type": per_type,
                "false_positives": fp,
                "false_negatives": fn,
            }
        )
    )


if __name__ == "__main__":
    main()
