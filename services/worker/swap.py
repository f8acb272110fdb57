"""What a worker serves and how a delivery changes it, free of I/O.

A worker holds one model (its engine's weights) and any LoRA adapters on it. Each
has a registry version (empty for what the worker was started with from a local
folder) and a role: ``current`` is served under its plain name and ``name@version``,
``candidate`` (a canary) and ``kept`` (an older adapter version, loaded for a quick
rollback) under ``name@version`` only.

A delivery is answered with a plan: its swap mode (``hot``: an adapter into the
running engine; ``warm``: same shapes, new weights in place; ``cold``: a new engine;
``none``: only the names change) and what the worker holds afterwards; or a reason
to skip it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import msgspec

from inferbus.contracts import (
    ModelDelivery,
    ModelResidency,
    ModelVersion,
    split_versioned,
    versioned_name,
)

CURRENT, CANDIDATE, KEPT = "current", "candidate", "kept"
ROLES = (CURRENT, CANDIDATE)
RESIDENCIES = ("hot", "warm", "cold")


class Held(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    version: str = ""
    role: str = CURRENT
    shape: str = ""
    quantization: str = ""
    path: str = ""
    """Where its files are (what the engine loads)."""

    @property
    def ref(self) -> str:
        return versioned_name(self.name, self.version) if self.version else self.name

    def names(self) -> list[str]:
        """The served names it answers to."""
        out = [self.name] if self.role == CURRENT else []
        if self.version:
            out.append(versioned_name(self.name, self.version))
        return out


class Holding(msgspec.Struct, kw_only=True, frozen=True):
    model: Held
    adapters: tuple[Held, ...] = ()

    def served(self) -> dict[str, Held]:
        """Served name → what answers it (the model or an adapter)."""
        out = {n: self.model for n in self.model.names()}
        for a in self.adapters:
            out |= {n: a for n in a.names()}
        return out

    def adapter_names(self) -> list[str]:
        return [n for a in self.adapters for n in a.names()]

    def versions(self) -> dict[str, str]:
        return {n: h.version for n, h in self.served().items() if h.version}

    def resolve(self, name: str) -> Held | None:
        """What serves a request for ``name``. A request routed before the worker's last
        swap may name what it just stopped advertising: the model's or an adapter's
        family still resolves to what the worker has now (its end says which
        version served it)."""
        if not name:
            return self.model
        exact = self.served().get(name)
        if exact is not None:
            return exact
        family, _ = split_versioned(name)
        if family == self.model.name:
            return self.model
        current = [a for a in self.adapters if a.name == family and a.role == CURRENT]
        return current[0] if current else None


class Skip(msgspec.Struct, kw_only=True, frozen=True):
    reason: str
    answer: bool = False
    """Say so on the bus: the delivery named this worker, or it is one the worker
    should have been able to take (a wrong role)."""


class Plan(msgspec.Struct, kw_only=True, frozen=True):
    mode: str
    """``hot``, ``warm``, ``cold`` or ``none``."""
    after: Holding
    load: Held
    """What is loaded (its ``path`` filled in once fetched)."""
    unload: tuple[Held, ...] = ()
    """Adapters the engine drops (a cold swap drops them all with the old engine)."""


def plan(
    holding: Holding,
    delivery: ModelDelivery,
    worker_id: str,
    origin: Holding | None = None,
    cannot_serve: Callable[[str], str] = lambda quantization: "",
) -> Plan | Skip:
    """``origin``: what the worker was started with, for a delivery of version "" (a
    rollback to it); its files need no fetch. ``cannot_serve``: why this worker's engine
    cannot serve a quantization ("" when it can)."""
    mv = delivery.model
    addressed = bool(delivery.workers)
    if addressed and worker_id not in delivery.workers:
        return Skip(reason="addressed to other workers")
    if delivery.role not in ROLES:
        return Skip(reason=f"unknown role {delivery.role!r}", answer=addressed)
    new = Held(
        name=mv.name,
        version=mv.version,
        role=delivery.role,
        shape=mv.shape,
        quantization=mv.quantization,
    )
    if not mv.version:
        mine = [
            h for h in ((origin.model, *origin.adapters) if origin else ()) if h.name == mv.name
        ]
        if not mine:
            return Skip(
                reason=f"back to its own {mv.name!r}: this worker was not started with it",
                answer=addressed,
            )
        new = msgspec.structs.replace(mine[0], role=delivery.role)
    if mv.kind == "adapter":
        if mv.base_model != holding.model.name:
            return Skip(
                reason=f"an adapter on {mv.base_model!r}; this worker serves "
                f"{holding.model.name!r}",
                answer=addressed,
            )
        return _plan_adapter(holding, new)
    if not addressed and mv.name != holding.model.name:
        return Skip(reason=f"for {mv.name!r} workers")
    if why := cannot_serve(mv.quantization):  # refused before any engine starts on it
        return Skip(reason=f"{mv.ref} is {mv.quantization}: {why}", answer=True)
    old = holding.model
    if (old.name, old.version) == (mv.name, mv.version):
        return Plan(
            mode="none",
            after=msgspec.structs.replace(holding, model=_keep_path(new, old)),
            load=_keep_path(new, old),
        )
    same_shape = bool(old.shape) and (old.shape, old.quantization) == (new.shape, new.quantization)
    if same_shape:
        # adapters of the same model still fit the same shapes
        kept = holding.adapters if mv.name == old.name else ()
        dropped = () if mv.name == old.name else holding.adapters
        return Plan(mode="warm", after=Holding(model=new, adapters=kept), load=new, unload=dropped)
    return Plan(mode="cold", after=Holding(model=new), load=new, unload=holding.adapters)


def _keep_path(new: Held, old: Held) -> Held:
    return msgspec.structs.replace(new, path=old.path)


def _plan_adapter(holding: Holding, new: Held) -> Plan:
    same = [a for a in holding.adapters if (a.name, a.version) == (new.name, new.version)]
    others = [a for a in holding.adapters if (a.name, a.version) != (new.name, new.version)]
    unload: tuple[Held, ...] = ()
    if new.role == CURRENT:
        # the adapter's current version stays loaded, by version only (a quick rollback);
        # a candidate of it is over (promoted: this one; rolled back: dropped)
        unload = tuple(a for a in others if a.name == new.name and a.role == CANDIDATE)
        others = [
            msgspec.structs.replace(a, role=KEPT) if a.name == new.name and a.role == CURRENT else a
            for a in others
            if a not in unload
        ]
    if same:
        loaded = _keep_path(new, same[0])
        return Plan(
            mode="none",
            after=Holding(model=holding.model, adapters=(*others, loaded)),
            load=loaded,
            unload=unload,
        )
    return Plan(
        mode="hot",
        after=Holding(model=holding.model, adapters=(*others, new)),
        load=new,
        unload=unload,
    )


def worth_prefetching(holding: Holding, mv: ModelVersion) -> bool:
    """A version this worker may be asked to load next (its model's or its base's)."""
    serves = holding.model.name
    return bool(mv.version) and (mv.base_model if mv.kind == "adapter" else mv.name) == serves


def with_path(p: Plan, path: str) -> Plan:
    """The plan once its version is fetched to ``path``."""
    load = msgspec.structs.replace(p.load, path=path)
    after = p.after
    if after.model.ref == load.ref and after.model.role == load.role:
        after = msgspec.structs.replace(after, model=load)
    else:
        after = msgspec.structs.replace(
            after,
            adapters=tuple(load if a.ref == load.ref else a for a in after.adapters),
        )
    return msgspec.structs.replace(p, load=load, after=after)


# -- residency -------------------------------------------------------------------------------


def residency_at(policy: ModelResidency, now: float) -> str:
    """The policy's residency at unix time ``now`` (UTC windows; the first that holds)."""
    minute = datetime.fromtimestamp(now, UTC)
    at = minute.hour * 60 + minute.minute
    for w in policy.schedule:
        start, end = _minutes(w.start), _minutes(w.end)
        inside = start <= at < end if start <= end else (at >= start or at < end)
        if inside:
            return w.residency
    return policy.residency


def _minutes(hhmm: str) -> int:
    h, _, m = hhmm.partition(":")
    return int(h) * 60 + int(m or 0)


def check_residency(policy: ModelResidency) -> None:
    """Refuse a policy a worker could not apply (ValueError, for the dead letters)."""
    for r in (policy.residency, *(w.residency for w in policy.schedule)):
        if r not in RESIDENCIES:
            raise ValueError(f"residency {r!r}: use hot, warm or cold")
    for w in policy.schedule:
        for t in (w.start, w.end):
            h, sep, m = t.partition(":")
            if not (sep and h.isdigit() and m.isdigit() and int(h) < 24 and int(m) < 60):
                raise ValueError(f"window time {t!r}: use HH:MM (UTC)")


class ResidencyEffects(msgspec.Struct, kw_only=True, frozen=True):
    pin: tuple[Held, ...] = ()
    """Adapters to hold loaded in the engine."""
    unpin: tuple[Held, ...] = ()
    """Adapters to let go from the engine (loaded again on their next request)."""
    drop: tuple[Held, ...] = ()
    """``kept`` adapters to stop serving and delete from the disk cache."""


def apply_residency(
    holding: Holding, policies: dict[str, ModelResidency], now: float, pinned: frozenset[str]
) -> tuple[Holding, ResidencyEffects]:
    """What the residency policies ask of the adapters now, given those ``pinned`` in
    the engine (by ref). The serving model is always loaded: a policy on it changes
    nothing here (its older versions are never held by a worker)."""
    pin, unpin, drop, keep = [], [], [], []
    for a in holding.adapters:
        policy = policies.get(a.name)
        residency = residency_at(policy, now) if policy else "hot"
        if residency == "cold" and a.role == KEPT:
            drop.append(a)
            continue
        keep.append(a)
        if residency == "hot" and a.ref not in pinned:
            pin.append(a)
        elif residency != "hot" and a.ref in pinned:
            unpin.append(a)
    after = msgspec.structs.replace(holding, adapters=tuple(keep))
    return after, ResidencyEffects(pin=tuple(pin), unpin=tuple(unpin), drop=tuple(drop))
