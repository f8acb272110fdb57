"""The state folder `inferbus up` writes (bus credentials, the signing key): private,
and a warning where a ``git add -A`` would commit it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from inferbus.up import committable, keep_private

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_a_state_folder_a_work_tree_does_not_ignore_is_committable(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    state = tmp_path / ".inferbus"
    keep_private(state)
    assert committable(state)
    (tmp_path / ".gitignore").write_text(".inferbus/\n")
    assert not committable(state)
    assert not committable(tmp_path.parent / "elsewhere-not-a-repo")  # absent, no repo


def test_outside_a_work_tree_nothing_is_said(tmp_path: Path) -> None:
    state = tmp_path / "state"
    keep_private(state)
    assert not committable(state)


def test_the_state_folder_is_its_owner_s_only(tmp_path: Path) -> None:
    state = tmp_path / "s"
    state.mkdir(mode=0o755)
    keep_private(state)
    assert state.stat().st_mode & 0o777 == 0o700


def test_this_repository_ignores_the_default_state_folder() -> None:
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        ["git", "-C", str(root), "check-ignore", "-q", ".inferbus/"], capture_output=True
    )
    if out.returncode == 128:
        pytest.skip("the checkout is not a git work tree")
    assert out.returncode == 0


def test_a_reader_gone_does_not_stop_inferbus_up_from_speaking_or_stopping(monkeypatch):
    import sys

    from inferbus import up

    class Gone:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Gone())
    up._say("inferbus is up")  # the banner's next line, after `| head` exited
    up._say("stopping")  # and the stop's, which must not raise either
    assert not isinstance(sys.stdout, Gone)
