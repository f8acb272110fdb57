"""What the KV spill service writes on the bus (shared/subscriptions.py): what the
shared tier holds per model, in its KV bucket; it reads nothing from the bus."""

from __future__ import annotations

from inferbus.contracts import KV_SPILL_INDEX
from inferbus.shared.subscriptions import Wiring

WIRING = Wiring(publishes=(f"$KV.{KV_SPILL_INDEX}.>",))
