"""``inferbus top``: a live terminal view of the running platform.

A pure core (``snapshot``, ``rates``, ``quantile``, ``fleet``, ``traffic``, ``view``)
turns two snapshots of ``$SRV`` stats and /metrics into a view model; a thin adapter
reads the snapshots (``collect``) and shows the view (``render``, ``command``).
"""
