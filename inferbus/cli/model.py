"""``inferbus model``: make a tiny model; push, sign, deploy and roll back versions."""

from __future__ import annotations

from pathlib import Path

import click

from . import modelversions


@click.group()
def model() -> None:
    """Models: make a tiny one; push, sign, deploy and roll back versions."""


modelversions.register(model)


@model.command("make-tiny")
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option(
    "--lora",
    "lora_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write a tiny LoRA adapter for it here.",
)
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--arch",
    type=click.Choice(["tiny", "tiny-deep", "1b"]),
    default="tiny",
    show_default=True,
    help="tiny: 2 layers, hidden 128. tiny-deep: 4 layers. 1b: a Llama-3.2-1B shape, "
    "for GPU benchmarks.",
)
def make_tiny_cmd(out_dir: Path, lora_dir: Path | None, seed: int, arch: str) -> None:
    """Build a tiny random-weight Llama with a locally trained tokenizer (seconds)."""
    from inferbus.tinymodel import make_tiny, make_tiny_lora

    click.echo(f"model  {make_tiny(out_dir, seed=seed, arch=arch)}")
    if lora_dir is not None:
        click.echo(f"lora   {make_tiny_lora(out_dir, lora_dir)}")
