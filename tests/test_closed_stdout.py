"""Commands whose reader goes away (`execbox-runner info | head -1`) stop quietly, without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

COMMANDS = {
    "info": [sys.executable, "-m", "execbox_runner", "info"],
    "exec": [sys.executable, "-m", "execbox_runner", "exec", "1 + 1"],
    "conformance --list": [sys.executable, "-m", "execbox_runner_conformance", "--list"],
}


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_a_closed_stdout_ends_the_command_with_status_1_and_no_traceback(command: list[str]) -> None:
    reader, writer = os.pipe()
    os.close(reader)  # every write to stdout fails with EPIPE, as once `head` has exited
    try:
        done = subprocess.run(command, stdout=writer, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(writer)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
