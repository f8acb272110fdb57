"""When a request would start, from the rates the scheduler measures, and whether that
is within its latency objective. No I/O: time is passed in.

Overload is judged by goodput, the share of requests whose first token comes within
their TTFT objective (``slo_s``): a request that waits in the queue past it and is
then served, or timed out, counts as missed all the same, and it held a place that
another could have met its objective with. So a request the fleet cannot start in
time is refused at once, with the wait as its Retry-After, and the requests taken
run in order of their objective's deadline.

The estimate adds two waits a request meets (``Fleet.wait``): the prefill ahead of it
(prompt tokens queued here and assigned but not started, at the fleet's measured
prefill rate) and the sequence slots ahead of it (what is queued beyond the free
slots, at the rate slots free: the slots over the measured time a request holds one).
Rates are measured from the workers' own reports (starts and ends), decayed over
``RATE_TAU_S``; a wait counts once its rate is measured, and until one is nothing is
refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RATE_TAU_S = 10.0
"""Old measurements fade with this time constant: a rate follows a changed load (a
new model version, long prompts after short ones) within seconds."""


def slo_s(prompt_tokens: int, priority: str, base_s: float, prefill_tokens_per_s: float) -> float:
    """A request's TTFT objective: ``base_s`` plus its prompt at the stated prefill
    rate; ``batch`` requests have none (only their deadline and the queue timeout)."""
    if priority == "batch" or base_s <= 0:
        return math.inf
    return base_s + (prompt_tokens / prefill_tokens_per_s if prefill_tokens_per_s > 0 else 0.0)


class Decayed:
    """A ratio of two sums that fade with ``RATE_TAU_S``: tokens over seconds busy."""

    def __init__(self) -> None:
        self.num = 0.0
        self.den = 0.0
        self.at = 0.0

    def add(self, num: float, den: float, now: float) -> None:
        if now > self.at:
            fade = math.exp(-(now - self.at) / RATE_TAU_S)
            self.num *= fade
            self.den *= fade
            self.at = now
        self.num += num
        self.den += den

    def value(self, least: float) -> float | None:
        """The ratio, once ``den`` (decayed) is at least ``least``."""
        return self.num / self.den if self.den >= least else None


class WorkerRates:
    """One worker's measured prefill rate (tokens a second) and how long a request
    holds one of its slots (seconds, assignment to end)."""

    def __init__(self) -> None:
        self.prefill = Decayed()
        self.hold = Decayed()
        self.last_start = 0.0
        self.reported: float | None = None
        """The prefill rate the worker measures itself (its heartbeat's
        ``prefill_s_per_token``: its requests' own prefill times)."""

    def on_start(self, prompt_tokens: int, assigned_at: float, now: float) -> None:
        """A request assigned before the worker's previous start waited for that
        prefill: the worker was busy from then to ``now`` (starts in one engine step
        share that time). One assigned later says nothing of its capacity: a worker
        with room starts it after a step whatever its rate."""
        if assigned_at <= self.last_start:
            self.prefill.add(prompt_tokens, now - self.last_start, now)
        self.last_start = max(self.last_start, now)

    def on_end(self, assigned_at: float, now: float) -> None:
        self.hold.add(now - assigned_at, 1.0, now)

    def prefill_rate(self) -> float | None:
        """Once half a second of prefill was seen, or the worker said: the higher of
        the two. The gaps between starts read low where other streams' decode steps
        widen them (a CPU engine: 16 tokens/s read where a prompt took 27 ms, and 14
        of 16 requests refused); the worker's own figure is a request's prefill alone,
        which overlapping prefills on a GPU beat."""
        measured = self.prefill.value(0.5)
        if self.reported is None:
            return measured
        return max(measured or 0.0, self.reported)

    def hold_s(self) -> float | None:
        """Once three requests ended."""
        return self.hold.value(3.0)


@dataclass
class Fleet:
    """What stands ahead of a new request for one model, and how fast it goes."""

    prefill_ahead: int = 0
    """Prompt tokens queued ahead of it here (any worker may take them)."""
    least_pending: int | None = None
    """The fewest prompt tokens assigned to one of its workers and not yet started:
    the engine's own queue, where a request routed there waits (None: no worker)."""
    pending: int = 0
    """Those tokens summed over its workers."""
    queued_seqs: int = 0
    free_seqs: int = 0
    prefill_rate: float | None = None
    """Summed over its ready workers, each at the mean of those measured (None: none
    has been)."""
    workers: int = 0
    """Its ready workers: a prompt prefills on one of them."""
    slots: int = 0
    hold_s: float | None = None
    """The mean time a request holds a slot (None: not measured)."""

    def wait(self, prompt_tokens: int, granted_s: float = math.inf) -> float | None:
        """When a request of ``prompt_tokens`` would have its first token, as the
        fleet goes now (None: neither rate measured yet). Its own prefill counts at
        most ``granted_s``, what its objective grants it: a fleet slower than that
        would miss it idle too, and only what is ahead of a request refuses it. Each
        wait counts once its rate is measured: a fleet bound by its slots (short
        prompts, long answers) never waits behind another's prefill, so its prefill
        rate may never be, while its slots hold everything up."""
        prefill = None
        if self.prefill_rate is not None and self.prefill_rate > 0:
            per_worker = self.prefill_rate / max(1, self.workers)
            # routed where the load is light, not always to the lightest: halfway between
            engine = (
                ((self.least_pending or 0) + self.pending / max(1, self.workers)) / 2 / per_worker
            )
            own = min(prompt_tokens / per_worker, granted_s)
            prefill = self.prefill_ahead / self.prefill_rate + engine + own
        slots = None
        if self.hold_s is not None and self.slots > 0:
            short = self.queued_seqs + 1 - self.free_seqs
            slots = max(0, short) * self.hold_s / self.slots
        if prefill is None and slots is None:
            return None
        return (prefill or 0.0) + (slots or 0.0)

    @property
    def idle(self) -> bool:
        """Nothing ahead: a request placed now starts at once, whatever the estimate."""
        return not self.prefill_ahead and not self.least_pending and self.free_seqs > 0
