"""Commands whose reader goes away (`execbox-runner info | head -1`) stop quietly, without a traceback;
ones whose stdout is full (`> /dev/full`) say so in one line. Either way the status is 1."""

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


# The conformance kit's command is left out: the tests run its installed copy, not this tree's.
@pytest.mark.parametrize("command", [COMMANDS["info"], COMMANDS["exec"]], ids=["info", "exec"])
def test_a_full_stdout_ends_the_command_with_status_1_and_one_line(command: list[str]) -> None:
    with open("/dev/full", "w") as full:  # every write fails with ENOSPC
        done = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr == "execbox-runner: cannot write to stdout: No space left on device\n", done.stderr
