"""A partitioned scheduler's pure parts: the leases (who owns which partition), the
coarse choice of a partition for a request, and the hand-off of requests a partition
has no worker for. The leases run against a bucket with JetStream KV's semantics
(a revision per write, create and update on a revision fail when it moved)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from inferbus.contracts import (
    ModelLoad,
    RequestSubmitted,
    SchedulerLoad,
    WorkAssigned,
    WorkerHeartbeat,
    worker_partition,
)
from inferbus.services.scheduler.core import HandOff, SchedulerCore, latest_attempts
from inferbus.services.scheduler.leases import Claim, Leases, Put, Release, Renew, part_key
from inferbus.shared.partitions import PartitionView


@dataclass
class Bucket:
    """JetStream KV as the leases see it: every write seen by every watcher."""

    values: dict[str, tuple[str, int]] = field(default_factory=dict)
    revision: int = 0
    watchers: list[Leases] = field(default_factory=list)
    released: list[tuple[str, int, float]] = field(default_factory=list)

    def write(self, key: str, value: str, now: float, last: int | None = None) -> int | None:
        held = self.values.get(key)
        if last is not None and (held[1] if held else 0) != last:
            return None  # another write came first
        self.revision += 1
        self.values[key] = (value, self.revision)
        for w in self.watchers:
            w.seen(key, value, self.revision, now)
        return self.revision

    def delete(self, key: str, now: float) -> None:
        self.write(key, "", now)

    def run(self, leases: Leases, now: float) -> None:
        """One round of the adapter's: carry out a step."""
        for op in leases.step(now):
            if isinstance(op, Put):
                self.write(op.key, op.value, now)
                continue
            if isinstance(op, Release):  # the service let go of it first
                self.write(part_key(op.partition), "", now, last=op.revision)
                self.released.append((leases.me, op.partition, now))
                continue
            assert isinstance(op, Claim | Renew)
            rev = self.write(part_key(op.partition), leases.me, now, last=op.revision)
            if rev is not None:
                leases.claimed(op.partition, rev, now)
            elif isinstance(op, Renew):
                leases.refused(op.partition)

    def owners(self) -> dict[int, str]:
        return {
            int(k.split(".")[1]): v
            for k, (v, _) in self.values.items()
            if k.startswith("part.") and v
        }


def fleet(n: int, partitions: int, bucket: Bucket, started: float = 0.0) -> list[Leases]:
    out = [Leases(f"s{i}", partitions, ttl_s=3.0, started_at=started) for i in range(n)]
    bucket.watchers += out
    return out


def rounds(bucket: Bucket, leases: list[Leases], start: float, end: float) -> float:
    t = start
    while t < end:
        for lease in leases:
            bucket.run(lease, t)
        t += 1.0
    return t


def test_instances_starting_together_split_the_partitions_evenly():
    bucket = Bucket()
    leases = fleet(3, 8, bucket)
    rounds(bucket, leases, 0.0, 5.0)
    owners = bucket.owners()
    assert sorted(owners) == list(range(8))
    counts = sorted(sum(1 for o in owners.values() if o == x.me) for x in leases)
    assert counts == [2, 3, 3]  # at most ceil(8 / 3) each
    for x in leases:  # each believes what the bucket says
        assert set(x.owned) == {p for p, o in owners.items() if o == x.me}


def test_no_partition_is_claimed_before_a_lease_time_has_passed():
    bucket = Bucket()
    (alone,) = fleet(1, 4, bucket)
    rounds(bucket, [alone], 0.0, 2.5)
    assert not alone.owned  # others starting now would not be heard yet
    rounds(bucket, [alone], 3.0, 4.0)
    assert set(alone.owned) == {0, 1, 2, 3}


def test_a_dead_instance_s_partitions_are_taken_within_a_lease_time():
    bucket = Bucket()
    a, b = fleet(2, 4, bucket)
    t = rounds(bucket, [a, b], 0.0, 5.0)
    assert len(a.owned) == len(b.owned) == 2
    dead_at = t
    while set(bucket.owners().values()) != {"s1"}:
        bucket.run(b, t)  # a renews nothing any more
        t += 1.0
        assert t - dead_at < 10
    assert t - dead_at <= a.ttl_s + 2.0  # stale after ttl_s, claimed on the next round
    assert set(b.owned) == {0, 1, 2, 3}


def test_an_instance_counting_partitions_otherwise_claims_nothing():
    """Two counts map workers to partitions differently: a worker would be booked by
    two instances. The newcomer hears the others' count and takes nothing (its start
    is refused: holder.join); the others claim nothing while it is alive."""
    bucket = Bucket()
    a, b = fleet(2, 4, bucket)
    t = rounds(bucket, [a, b], 0.0, 5.0)
    held = {p: bucket.owners()[p] for p in range(4)}
    odd = Leases("s9", 8, ttl_s=3.0, started_at=t)
    bucket.watchers.append(odd)
    for key, (value, rev) in bucket.values.items():
        odd.seen(key, value, rev, t)
    t = rounds(bucket, [a, b, odd], t, t + 5.0)
    assert odd.disagreeing(t) == {"s0": 4, "s1": 4}
    assert not odd.owned and bucket.owners() == held
    assert a.disagreeing(t) == {"s9": 8}  # a and b keep serving what they hold
    assert set(a.owned) | set(b.owned) == {0, 1, 2, 3}


def test_an_instance_added_while_others_run_is_given_partitions():
    """Two hold four partitions; a third joins: once it has heard the others for a
    lease time, the first of the two releases one and the newcomer claims it; one
    release, never a partition held twice or left free longer than a round."""
    bucket = Bucket()
    a, b = fleet(2, 4, bucket)
    t = rounds(bucket, [a, b], 0.0, 5.0)
    c = Leases("s2", 4, ttl_s=3.0, started_at=t)
    bucket.watchers.append(c)
    for key, (value, rev) in bucket.values.items():
        c.seen(key, value, rev, t)
    seen_free = 0
    while t < 30.0:
        for x in (a, b, c):
            bucket.run(x, t)
        held = [p for x in (a, b, c) for p in x.owned]
        assert len(held) == len(set(held))  # one owner a partition
        seen_free = seen_free + 1 if len(held) < 4 else 0
        assert seen_free <= 1  # a released partition is claimed within a round
        t += 1.0
    assert sorted(len(x.owned) for x in (a, b, c)) == [1, 1, 2]
    assert len(bucket.released) == 1 and bucket.released[0][0] == "s0"
    assert bucket.released[0][2] >= 5.0 + c.ttl_s  # not before it heard the others


def test_a_balanced_tier_releases_nothing():
    bucket = Bucket()
    leases = fleet(3, 8, bucket)
    rounds(bucket, leases, 0.0, 40.0)
    assert sorted(len(x.owned) for x in leases) == [2, 3, 3]
    assert bucket.released == []


def test_released_leases_are_taken_at_once():
    bucket = Bucket()
    a, b = fleet(2, 4, bucket)
    t = rounds(bucket, [a, b], 0.0, 5.0)
    for p, _revision in a.release():
        bucket.delete(part_key(p), t)
    bucket.delete("member.s0", t)
    bucket.run(b, t + 0.1)
    assert set(b.owned) == {0, 1, 2, 3}


def test_an_instance_restarted_under_its_name_takes_its_own_back_at_once():
    """A supervisor restarts a killed scheduler with the same instance id in about a
    second: it must not wait out its old leases (nor a settling period) to serve."""
    bucket = Bucket()
    a, b = fleet(2, 4, bucket)
    t = rounds(bucket, [a, b], 0.0, 5.0)
    mine = set(a.owned)
    again = Leases("s0", 4, ttl_s=3.0, started_at=t + 1.0)  # a's successor
    bucket.watchers.append(again)
    for key, (value, rev) in bucket.values.items():  # what its watch delivers first
        again.seen(key, value, rev, t + 1.0)
    bucket.run(again, t + 1.0)
    assert set(again.owned) == mine
    bucket.run(b, t + 1.5)
    assert set(b.owned).isdisjoint(mine)


def test_an_instance_that_stalled_past_its_lease_finds_it_lost():
    bucket = Bucket()
    a, b = fleet(2, 2, bucket)
    t = rounds(bucket, [a, b], 0.0, 5.0)
    mine = set(a.owned)
    t = rounds(bucket, [b], t, t + 5.0)  # a stalls: b takes its partition over
    assert set(b.owned) == {0, 1}
    assert a.lost == mine  # heard through the watch
    assert not a.owned
    bucket.run(a, t)  # and claims nothing it does not hold
    assert set(b.owned) == {0, 1}


def test_a_lease_it_could_not_renew_is_given_up_before_others_may_take_it():
    """Renewals that time out (not refused: no answer) leave the instance believing
    it holds the lease while the others see it lapse a lease time after its last
    write: it gives it up itself at the last round whose successor could come too
    late (two thirds of a lease time), before any other instance may claim it."""
    bucket = Bucket()
    a, b = fleet(2, 2, bucket)
    t = rounds(bucket, [a, b], 0.0, 5.0)
    mine = set(a.owned)
    last = t - 1.0  # its last acknowledged renewal was sent then
    a.step(last + 1.9)  # its writes go unanswered: nothing claimed
    assert set(a.owned) == mine
    a.step(last + 2.0)
    assert not a.owned and a.lost == mine
    assert all(b.holder(p, last + 2.0) == "s0" for p in mine)  # not free yet


def test_a_draining_instance_renews_but_takes_nothing():
    bucket = Bucket()
    a, b = fleet(2, 4, bucket)
    t = rounds(bucket, [a, b], 0.0, 5.0)
    a.claiming = False
    for p, _revision in b.release():  # a peer drains first
        bucket.delete(part_key(p), t)
    bucket.run(a, t + 0.1)
    assert len(a.owned) == 2  # its own renewed, the peer's left for a third


def test_a_renewal_on_a_moved_revision_is_refused_and_counted_lost():
    bucket = Bucket()
    (a,) = fleet(1, 1, bucket)
    rounds(bucket, [a], 0.0, 4.0)
    a._keys.clear()  # the watch fell behind: a still renews on its old revision
    bucket.values[part_key(0)] = ("other", bucket.revision + 5)
    bucket.run(a, 4.0)
    assert a.lost == {0} and not a.owned


def request(rid: str, model: str = "m", hashes: list[int] | None = None) -> RequestSubmitted:
    return RequestSubmitted(
        request_id=rid, model=model, reply_to="r", prompt="p", prefix_hashes=hashes or []
    )


def report(sid: str, parts: list[int], **models: ModelLoad) -> SchedulerLoad:
    return SchedulerLoad(scheduler_id=sid, models=models, partitions=parts, interval_s=0.25)


def test_a_request_goes_to_a_partition_with_workers_for_its_model():
    view = PartitionView(4)
    view.on_load(report("a", [0, 1], other=ModelLoad(ready_workers=2, free_slots=8)), 0.0)
    view.on_load(report("b", [2, 3], m=ModelLoad(ready_workers=1, free_slots=1)), 0.0)
    for i in range(50):
        assert view.choose(request(f"r{i}", hashes=[i, i + 1]), 0.1) in (2, 3)


def test_the_roomier_instance_wins_and_equals_split_by_prefix():
    view = PartitionView(4)
    view.on_load(report("a", [0, 1], m=ModelLoad(ready_workers=2, free_slots=8)), 0.0)
    view.on_load(report("b", [2, 3], m=ModelLoad(ready_workers=2, free_slots=0, queued=6)), 0.0)
    assert {view.choose(request(f"r{i}", hashes=[1, 2, 3, i]), 0.1) for i in range(50)} <= {0, 1}
    view.on_load(report("b", [2, 3], m=ModelLoad(ready_workers=2, free_slots=7)), 0.0)
    chosen = [view.choose(request(f"r{i}", hashes=[1, 2, 3, i]), 0.1) for i in range(200)]
    assert {0, 1, 2, 3} == set(chosen)  # near-equal room: spread by prefix
    # the same prefix (a conversation's next turn) always goes to the same place
    assert len({view.choose(request(f"x{i}", hashes=[1, 2, 3, 9, i]), 0.1) for i in range(20)}) == 1


def test_with_no_report_the_model_name_picks_the_partition():
    view = PartitionView(8)
    assert len({view.choose(request(f"r{i}", "cold"), 0.0) for i in range(20)}) == 1
    view.on_load(report("a", [0], m=ModelLoad(ready_workers=1, free_slots=1)), 0.0)
    assert view.choose(request("r", "m"), 10.0) == view.choose(request("q", "m"), 10.0)
    assert view.serving(10.0) == set()  # the report went stale
    assert PartitionView(1).choose(request("r"), 0.0) is None  # unpartitioned


def test_but_excludes_an_instance_and_says_when_no_other_serves():
    view = PartitionView(4)
    view.on_load(report("a", [0, 1], m=ModelLoad(ready_workers=1, free_slots=1)), 0.0)
    assert view.choose(request("r"), 0.1, but="a") is None
    assert view.serving(0.1, but="a") == set()
    view.on_load(report("b", [2, 3], m=ModelLoad(ready_workers=1, free_slots=1)), 0.0)
    assert view.choose(request("r"), 0.1, but="a") in (2, 3)
    assert view.serving(0.1, but="a") == {"m"}


def heartbeat(worker: str, model: str) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        worker_id=worker, models=[model], engine="sim", max_num_seqs=4, state="ready"
    )


def test_requests_for_a_model_served_elsewhere_are_handed_off_after_a_wait():
    core = SchedulerCore()
    core.on_heartbeat(heartbeat("w1", "here"), 0.0, 0.0)
    for i in range(3):
        core.on_accepted(request(f"r{i}", "there"), 0.0, 0.0)
    core.on_accepted(request("h", "here"), 0.0, 0.0)
    assert core.hand_off({"there", "here"}, 0.5, after_s=1.0) == []  # not yet
    assert core.hand_off(set(), 1.5, after_s=1.0) == []  # served nowhere: they wait
    out = core.hand_off({"there", "here"}, 1.5, after_s=1.0)
    assert [e.request.request_id for e in out if isinstance(e, HandOff)] == ["r0", "r1", "r2"]
    assert not any(core.knows(f"r{i}") for i in range(3))  # no longer this one's
    assert core.knows("h")  # its own model: placed here


def test_workers_let_go_are_forgotten_with_their_requests_and_nothing_ends():
    """A partition given away: its workers' requests run on there, the new owner's to
    end; this core must neither fail nor move them when it hears no more of them."""
    core = SchedulerCore()
    core.on_heartbeat(heartbeat("w1", "m"), 0.0, 0.0)
    core.on_heartbeat(heartbeat("w2", "m"), 0.0, 0.0)
    placed = [e for i in range(4) for e in core.on_accepted(request(f"r{i}"), 0.0, 0.0)]
    on_w1 = {e.request.request_id for e in placed if getattr(e, "worker_id", "") == "w1"}
    assert on_w1 and len(placed) == 4
    assert set(core.let_go(["w1"])) == on_w1
    assert "w1" not in core.workers and not any(core.knows(r) for r in on_w1)
    core.on_heartbeat(heartbeat("w2", "m"), 9.0, 9.0)
    effects = core.tick(10.0)  # long after w1's last heartbeat here
    assert all(e.request.request_id not in on_w1 for e in effects)
    assert core.on_ended(sorted(on_w1)[0], 10.0) == []  # its end, read here, changes nothing


def test_a_retry_is_not_handed_off():
    core = SchedulerCore()
    core.on_accepted(request("r", "there"), 0.0, 0.0)
    (item,) = list(core.queues["there"])
    item.attempt = 2  # a retry: its next attempt's number is known here only
    assert core.hand_off({"there"}, 5.0, after_s=1.0) == []


def test_random_fleets_keep_one_owner_per_partition():
    rng = random.Random(7)
    for trial in range(20):
        bucket = Bucket()
        leases = fleet(rng.randint(1, 5), rng.randint(1, 12), bucket, started=0.0)
        alive = list(leases)
        t = 0.0
        for _ in range(40):
            if len(alive) > 1 and rng.random() < 0.05:
                alive.remove(rng.choice(alive))  # killed: renews nothing
            for x in alive:
                bucket.run(x, t)
            t += 1.0
            # whatever an instance believes it holds, the bucket says is its
            owners = bucket.owners()
            for x in alive:
                assert all(owners.get(p) == x.me for p in x.owned), (trial, t)
        for _ in range(5):  # a lease time with no more kills
            for x in alive:
                bucket.run(x, t)
            t += 1.0
        # in the end the live ones hold everything
        assert set(bucket.owners()) == set(range(leases[0].partitions))
        assert set(bucket.owners().values()) <= {x.me for x in alive}


def test_a_stream_moved_across_partitions_is_taken_back_by_its_new_partition_only():
    """A takeover restores each request's latest attempt over every stored assignment:
    a stream that moved from partition 0's worker to partition 1's (its worker lost,
    the continuation placed by the other instance) is partition 1's, and partition 0's
    new holder never books its old attempt again."""
    workers = {
        p: next(f"w{i}" for i in range(100) if worker_partition(f"w{i}", 2) == p) for p in (0, 1)
    }
    moved = [
        (WorkAssigned(request=request("moved"), worker_id=workers[0], attempt=1), "t1"),
        (WorkAssigned(request=request("moved"), worker_id=workers[1], attempt=2), "t2"),
        (WorkAssigned(request=request("stayed"), worker_id=workers[0], attempt=1), "t3"),
    ]

    def holder_of(partition: int):
        return lambda worker_id: worker_partition(worker_id, 2) == partition

    for stored in (moved, moved[::-1]):  # in whatever order the stream replays them
        zero = latest_attempts(stored, holder_of(0))
        one = latest_attempts(stored, holder_of(1))
        assert [(w.request.request_id, w.attempt, t) for w, t in zero] == [("stayed", 1, "t3")]
        assert [(w.request.request_id, w.attempt, t) for w, t in one] == [("moved", 2, "t2")]
