"""The kvspill service's core: what scans of the shared folder mean (saves, restores,
files gone) and what it evicts to stay within its bound."""

from __future__ import annotations

from inferbus.services.kvspill.core import FileSeen, SharedTier


def f(key: str, size: int = 100, atime: float = 0.0, mtime: float = 0.0) -> FileSeen:
    return FileSeen(f"ns:{key}", size, atime or mtime, mtime)


def test_new_files_are_saves_and_newer_access_times_are_restores():
    tier = SharedTier(capacity_bytes=1000)
    scan = tier.on_scan([f("a", mtime=1), f("b", mtime=2)])
    assert (scan.saved, scan.restored, scan.evict, scan.blocks) == (2, 0, [], 2)
    assert scan.namespaces["ns"].blocks == 2 and scan.namespaces["ns"].bytes == 200
    scan = tier.on_scan([f("a", mtime=1, atime=5), f("b", mtime=2)])
    assert (scan.saved, scan.restored) == (0, 1)
    scan = tier.on_scan([f("b", mtime=2)])  # someone deleted a
    assert scan.vanished == 1 and scan.blocks == 1 and scan.used_bytes == 100


def test_it_evicts_to_its_bound_and_keeps_what_workers_restore():
    tier = SharedTier(capacity_bytes=300)
    files = [f("hot", mtime=1), f("x", mtime=2), f("y", mtime=3)]
    tier.on_scan(files)
    files[0] = f("hot", mtime=1, atime=4)  # a worker restored it
    tier.on_scan(files)
    scan = tier.on_scan([*files, f("z", mtime=5), f("w", mtime=6)])
    assert len(scan.evict) == 2 and "ns:hot" not in scan.evict
    assert scan.used_bytes <= 300 and scan.blocks == 3
    # the evicted files are gone from its view; deleted by the adapter, they do not
    # come back as vanished
    kept = [x for x in [*files, f("z", mtime=5), f("w", mtime=6)] if x.key not in scan.evict]
    assert tier.on_scan(kept).vanished == 0


def test_a_file_it_could_not_delete_is_evicted_again():
    tier = SharedTier(capacity_bytes=100)
    tier.on_scan([f("a", mtime=1)])
    scan = tier.on_scan([f("a", mtime=1), f("b", mtime=2)])
    assert scan.evict == ["ns:a"]
    # the delete failed: a is seen again, admitted again, and b or a evicted
    scan = tier.on_scan([f("a", mtime=1), f("b", mtime=2)])
    assert len(scan.evict) == 1 and scan.used_bytes == 100


def test_namespaces_are_counted_apart():
    tier = SharedTier(capacity_bytes=10_000)
    scan = tier.on_scan([FileSeen("v1:a", 10, 1, 1), FileSeen("v2:b", 20, 1, 1)])
    assert {k: (n.blocks, n.bytes) for k, n in scan.namespaces.items()} == {
        "v1": (1, 10),
        "v2": (1, 20),
    }
