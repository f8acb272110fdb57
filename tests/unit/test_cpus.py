"""Core placement on CPU machines (shared/cpus.py)."""

from __future__ import annotations

from inferbus.shared.cpus import format_cpus, parse_cpus, split, why_not


def test_cpu_lists_round_trip() -> None:
    assert parse_cpus("0-2,5") == {0, 1, 2, 5}
    assert format_cpus({0, 1, 2, 5}) == "0-2,5"
    assert format_cpus({3}) == "3" and parse_cpus("") == set()


def test_a_quarter_at_least_one_for_the_services() -> None:
    assert split({0, 1}) == ({0}, {1})
    assert split(set(range(8))) == (set(range(6)), {6, 7})
    assert split({4, 5, 6}) == ({4, 5}, {6})
    assert split({0}) is None


def test_not_for_an_engine_that_does_no_cpu_work() -> None:
    assert "sim" in why_not("sim")


def test_off_and_the_engine_decide_first() -> None:
    assert why_not("vllm", "off") == "--cpu-placement off"
    assert why_not("sim", "on").startswith("the sim engine")
