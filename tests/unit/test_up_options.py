"""inferbus up's options are declared once (inferbus/upoptions.py): the command's
flags are made from the Options fields, and what they parse is an Options."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner

from inferbus.cli import up
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
