"""The view model as rich tables: Workers, Queues, Throughput & latency, Services."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from .rows import ModelRow, View

DASH = "–"


def _rate(value: float | None, unit: str = "/s") -> str:
    if value is None:
        return DASH
    return f"{value:,.1f}{unit}" if value < 100 else f"{value:,.0f}{unit}"


def _seconds(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _share(value: float | None) -> str:
    return DASH if value is None else f"{value:.1%}"


def _count(value: int | None) -> str:
    return DASH if value is None else str(value)


def _table(title: str, *columns: str, text: tuple[str, ...] = ()) -> Table:
    """Numbers right-aligned; the first column and those named in ``text`` left."""
    table = Table(title=title, title_justify="left", title_style="bold", expand=False)
    for i, name in enumerate(columns):
        table.add_column(
            name, justify="left" if i == 0 or name in text else "right", no_wrap=i == 0
        )
    return table


def workers_table(view: View) -> Table:
    table = _table(
        "Workers",
        "worker",
        "models",
        "state",
        "running",
        "assigned/max",
        "KV",
        "heartbeat",
        "decode tok/s",
        "note",
        text=("models", "state", "note"),
    )
    for w in view.workers:
        state = Text(w.state, style="green" if w.state == "ready" else "yellow")
        table.add_row(
            w.worker_id,
            ", ".join(w.models) or DASH,
            state,
            _count(w.running),
            f"{_count(w.assigned)}/{_count(w.max_num_seqs)}",
            _share(w.kv_cache_usage),
            _seconds(w.heartbeat_age_s),
            _rate(w.decode_tokens_per_s, ""),
            Text(w.note, style="yellow"),
        )
    if not view.workers:
        table.add_row(Text("no workers", style="red"))
    return table


def queues_table(view: View) -> Table:
    title = "Queues" + (
        f"  ({view.queued} waiting, {view.scheduler_inflight} in flight)"
        if view.queued is not None
        else ""
    )
    table = _table(title, "model", "lane", "depth", "oldest wait", text=("lane",))
    for q in view.queues:
        table.add_row(q.model, q.lane, str(q.depth), _seconds(q.oldest_wait_s))
    if not view.queues:
        table.add_row(
            Text(
                "no scheduler" if view.queued is None else "nothing queued yet",
                style="red" if view.queued is None else "dim",
            )
        )
    return table


def _model_cells(m: ModelRow) -> list[str | Text]:
    errors = Text(_share(m.error_ratio), style="red" if (m.error_ratio or 0) > 0 else "")
    return [
        m.model,
        _rate(m.requests_per_s),
        errors,
        _rate(m.prefill_tokens_per_s, ""),
        _rate(m.decode_tokens_per_s, ""),
        _seconds(m.ttft_p50_s),
        _seconds(m.ttft_p95_s),
        f"{m.ttft_count} from {m.ttft_source}" if m.ttft_source else DASH,
    ]


def traffic_table(view: View) -> Table:
    over = f" over {view.interval_s:.1f} s" if view.interval_s else " (needs a second look)"
    table = _table(
        "Throughput & latency" + over,
        "model",
        "requests",
        "errors",
        "prefill tok/s",
        "decode tok/s",
        "TTFT p50",
        "TTFT p95",
        "first tokens",
        text=("first tokens",),
    )
    for m in view.models:
        table.add_row(*_model_cells(m))
    if view.totals is not None:
        table.add_section()
        table.add_row(*_model_cells(view.totals), style="bold")
    return table


def services_table(view: View) -> Table:
    table = _table(
        "Services",
        "service",
        "instance",
        "ready",
        "in flight",
        "metrics",
        "detail",
        text=("instance", "ready", "metrics", "detail"),
    )
    for s in view.services:
        ready = Text(
            {True: "yes", False: "no", None: "?"}[s.ready], style="green" if s.ready else "red"
        )
        metrics = Text(s.metrics, style="" if s.metrics == "ok" else "red")
        table.add_row(s.service, s.instance, ready, _count(s.inflight), metrics, s.detail)
    for name in view.missing_services:
        table.add_row(Text(name, style="red"), Text("none answered on $SRV", style="red"))
    return table


def rollouts_table(view: View) -> Table:
    table = _table(
        "Rollouts",
        "model",
        "version",
        "phase",
        "on new",
        "canary workers",
        text=("version", "phase", "canary workers"),
    )
    styles = {"rolled_back": "red", "failed": "red", "done": "dim"}
    for r in view.rollouts:
        table.add_row(
            r.model,
            r.version,
            Text(r.phase, style=styles.get(r.phase, "")),
            _share(r.weight),
            ", ".join(r.workers) or "all of the base",
        )
    return table


def footer(view: View) -> Text:
    parts = []
    if view.gateway_refusals_per_s is not None:
        parts.append(f"gateway refusals {_rate(view.gateway_refusals_per_s)}")
    if view.traces is not None:
        t = view.traces
        parts.append(
            f"traces kept {_rate(t.kept_per_s)}, dropped {_rate(t.dropped_per_s)}, "
            f"spans dropped {_rate(t.spans_dropped_per_s)}"
        )
    return Text("  ·  ".join(parts), style="dim")


def render(view: View, heading: str) -> RenderableType:
    if view.problem:
        return Group(Text(heading, style="bold"), Text(view.problem, style="bold red"))
    return Group(
        Text(heading, style="bold"),
        workers_table(view),
        queues_table(view),
        traffic_table(view),
        services_table(view),
        *([rollouts_table(view)] if view.rollouts else []),
        footer(view),
    )
