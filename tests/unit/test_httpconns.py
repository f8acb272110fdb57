"""Which connection the cap closes (shared/httpconns.py): never the busy ones; first one
that never sent a request, then one that never authenticated, then the oldest idle."""

from __future__ import annotations

from inferbus.shared.httpconns import ConnectionLedger


def test_the_cap_sheds_idle_anonymous_connections_first():
    ledger = ConnectionLedger(limit=3)
    busy = {"streaming"}
    served = {"streaming": 1, "keyed": 3, "anonymous": 2, "silent": 0}
    for i, conn in enumerate(["streaming", "keyed", "anonymous", "silent"]):
        ledger.made(conn, float(i))
    ledger.trusted("keyed")
    ledger.trusted("streaming")
    order = []
    for arrival in ("new1", "new2", "new3"):  # each with its request under way
        busy.add(arrival)
        ledger.made(arrival, 10.0)
        gone = ledger.to_close(arrival, lambda c: c in busy, lambda c: served.get(c, 0))
        order.append(gone)
        ledger.lost(gone)
    # the silent one first, then the one that never authenticated, then by age
    assert order == ["silent", "anonymous", "keyed"]


def test_every_connection_busy_the_arrival_goes():
    ledger = ConnectionLedger(limit=1)
    ledger.made("a", 0.0)
    assert ledger.to_close("a", lambda c: True, lambda c: 1) is None  # under the cap
    ledger.made("b", 1.0)
    assert ledger.to_close("b", lambda c: True, lambda c: 1) == "b"
