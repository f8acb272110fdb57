"""inferbus up's options are declared once (inferbus/upoptions.py): the command's
flags are made from the Options fields, and what they parse is an Options."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner

from inferbus.cli.platform import up
from inferbus.upoptions import Options, click_options


def parsed(*argv: str) -> Options:
    seen: list[Options] = []

    @click.command()
    @click_options
    def command(**given: Any) -> None:
        seen.append(Options.from_flags(given))

    result = CliRunner().invoke(command, list(argv))
    assert result.exit_code == 0, result.output
    return seen[0]


def test_no_flags_give_the_declared_defaults():
    assert parsed() == Options()


def test_flags_set_their_fields_and_repeated_ones_make_lists():
    o = parsed(
        "--engine",
        "sim",
        "--workers",
        "3",
        "--no-selftest",
        "--check",
        "--worker-arg=--max-num-seqs=8",
        "--worker-arg=--dtype=float32",
        "--state-dir",
        "/tmp/x",
        "--nats-cluster",
        "3",
    )
    assert (o.engine, o.workers, o.selftest, o.check) == ("sim", 3, False, True)
    assert o.worker_args == ["--max-num-seqs=8", "--dtype=float32"]
    assert o.state_dir == Path("/tmp/x") and o.nats_cluster == 3


def test_every_flag_field_is_an_option_of_up_with_its_help():
    names = {p.name for p in up.params}
    for f in dataclasses.fields(Options):
        if "decls" in f.metadata:
            assert f.name in names and f.metadata["help"], f.name
        else:
            assert f.name not in names  # set by up itself (the probe key, restarts)
    assert CliRunner().invoke(up, ["--nats-cluster", "0"]).exit_code == 2  # a range


def test_each_service_is_launched_as_the_table_says(tmp_path):
    """The table names each service's launch function and the up options that start it
    and count it; Platform.command carries them out."""
    import inspect

    from inferbus import servicetable
    from inferbus.up import Platform

    fields = {f.name for f in dataclasses.fields(Options)}
    for entry in servicetable.SERVICES:
        if entry.launch:
            fn = servicetable.load(entry.launch)
            assert len(inspect.signature(fn).parameters) == 2, entry.launch
        assert entry.up_option in fields | {""} and entry.count_option in fields | {""}

    flags = f"--engine sim --state-dir {tmp_path} --host 0.0.0.0 --autoscale --workers 2"
    o = parsed(*flags.split(), "--sanitizer-arg=--max-prompt-chars=9")
    p = Platform(o, "nats://127.0.0.1:4222", "sim-model", "sim-model", [])

    def argv(service: str, index: int = 0) -> list[str]:
        entry = servicetable.get(service)
        return p.command(p.spec(entry, index)).argv

    worker = argv("worker", 1)
    assert worker[worker.index("--instance-id") + 1] == "worker-1"
    assert worker[worker.index("--engine") + 1] == "sim"
    assert "--models" in argv("autoscaler") and "--shared-dir" in argv("kvspill")
    gateway = argv("gateway", 1)
    assert gateway[gateway.index("--http-host") + 1] == "0.0.0.0"
    # every gateway shares up's port, the first and any scaled to later
    assert gateway[gateway.index("--http-reuse-port") + 1] == "true"
    assert gateway[gateway.index("--instance-id") + 1] == "gateway-1"
    assert gateway[gateway.index("--http-port") + 1] == str(p.o.port)
    assert argv("sanitizer", 1)[argv("sanitizer", 1).index("--instance-id") + 1] == "sanitizer-1"
    assert argv("sanitizer")[-1] == "--max-prompt-chars=9"
    assert "--engine" not in argv("scheduler")


def test_several_schedulers_share_partitions_every_service_is_told_of(tmp_path):
    from inferbus import servicetable
    from inferbus.up import Platform

    assert parsed("--engine", "sim").partitions == 1  # one scheduler: unpartitioned
    assert parsed("--engine", "sim", "--schedulers", "3").partitions == 12
    o = parsed("--engine", "sim", "--schedulers", "2", "--scheduler-partitions", "5")
    assert o.partitions == 5
    p = Platform(o, "nats://127.0.0.1:4222", "sim-model", "sim-model", [])
    assert p.env["INFERBUS_SCHEDULER_PARTITIONS"] == "5"  # the sanitizers' too
    names = [servicetable.get("scheduler").instance_name(i) for i in range(3)]
    assert names == ["scheduler", "scheduler-1", "scheduler-2"]
