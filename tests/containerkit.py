"""Podman for the tests: the production image, built once per test session from deploy/Dockerfile
on a base made from Debian's packages (deploy/image/debian-base.sh), and containers run and
removed by name.

Every podman command reads deploy/image/containers.conf. What a session builds carries its own
tag (the test process's id), so that two sessions on one machine never share or remove each
other's images, and is removed when the session ends. Where podman, mmdebstrap or runc is
missing, each test that needs them fails with one line naming it (`.ci/run` installs them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHECKOUT = Path(__file__).resolve().parent.parent
DEPLOY = CHECKOUT / "deploy"
CONTAINERS_CONF = DEPLOY / "image" / "containers.conf"
SESSION = f"test-{os.getpid()}"
BASE = f"localhost/execbox-runner-base:{SESSION}"
IMAGE = f"localhost/execbox-runner:{SESSION}"
# Debian's packages that hold what the tests run: podman itself, the runtime its config names, and
# mmdebstrap for the base.
TOOLS = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}
BUILD_TIMEOUT_S = 900  # each of the base and the image
# Where the build's pip finds the host's CA bundle (see ``host_ca_bundle``).
HOST_CA_IN_BUILD = "/run/host-ca.crt"


def environment() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``podman args``, its output captured; a failure (with ``check``) fails the test with it."""
    done = subprocess.run(
        ["podman", *args], env=environment(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        pytest.fail(f"podman {' '.join(args[:3])} ... exited {done.returncode}: {done.stderr[-3000:]}")
    return done


def missing() -> str | None:
    """One line naming what the image's tests need and this host lacks."""
    absent = [package for tool, package in TOOLS.items() if shutil.which(tool) is None]
    if absent:
        return f"not installed: {', '.join(absent)} (apt-get install {' '.join(absent)}; .ci/run does)"
    if os.geteuid() != 0:
        return "the image's tests run podman as root (the base is made by mmdebstrap's root mode)"
    return None


def host_ca_bundle() -> Path | None:
    """The CA bundle the build's pip is told to trust: this host's pip's (PIP_CERT), else the
    system's. pip's own bundle lacks the CA of a TLS-intercepting proxy, such as this CI's."""
    for named in (
        os.environ.get("PIP_CERT"),
        ssl.get_default_verify_paths().cafile,
        "/etc/ssl/certs/ca-certificates.crt",
    ):
        if named and Path(named).is_file():
            return Path(named)
    return None


def build() -> str:
    """The production image, built (a few minutes): the base from Debian's packages, then
    deploy/Dockerfile on it. ``remove_images`` removes both."""
    reason = missing()
    if reason:
        pytest.fail(reason)
    base = subprocess.run(
        ["sh", str(DEPLOY / "image" / "debian-base.sh"), BASE],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    if base.returncode != 0:
        pytest.fail(f"deploy/image/debian-base.sh exited {base.returncode}: {base.stderr[-3000:]}")
    certificates: list[str] = []
    bundle = host_ca_bundle()
    if bundle is not None:
        certificates = ["--volume", f"{bundle}:{HOST_CA_IN_BUILD}:ro", "--build-arg", f"PIP_CERT={HOST_CA_IN_BUILD}"]
    built = subprocess.run(
        [
            "podman",
            "build",
            "--format",
            "docker",
            "--layers=false",
            "--file",
            str(DEPLOY / "Dockerfile"),
            "--build-arg",
            f"PYTHON_IMAGE={BASE}",
            *certificates,
            "--tag",
            IMAGE,
            str(CHECKOUT),
        ],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    if built.returncode != 0:
        pytest.fail(f"podman build exited {built.returncode}: {built.stdout[-3000:]}{built.stderr[-3000:]}")
    return IMAGE


def remove_images() -> None:
    """This session's images (built without intermediate images: nothing else is left)."""
    for name in (IMAGE, BASE):
        podman("rmi", "--force", name, check=False)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Container:
    name: str

    def inspect(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(podman("inspect", "--type", "container", self.name).stdout)[0]
        return found

    def pid(self) -> int:
        """PID 1 of the container, as the host sees it."""
        return int(self.inspect()["State"]["Pid"])

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        """``command`` run in the container, as its user, with its environment."""
        return podman("exec", self.name, *command)

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def wait(self, timeout: float) -> int:
        """The container's exit code, once it has exited (within ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.inspect()["State"]
            if state["Status"] in ("exited", "stopped"):
                return int(state["ExitCode"])
            time.sleep(0.1)
        raise AssertionError(f"{self.name} still running after {timeout} s:\n{self.logs()[-3000:]}")


@contextlib.contextmanager
def running(name: str, *arguments: str) -> Iterator[Container]:
    """``podman run --detach --name NAME arguments``; the container is removed afterwards, by name,
    its log printed (pytest shows it when the test failed)."""
    container = Container(f"execbox-{SESSION}-{name}")
    podman("run", "--detach", "--name", container.name, *arguments, timeout=120)
    try:
        yield container
    finally:
        print(container.logs()[-20_000:])
        podman("rm", "--force", "--time", "0", container.name, check=False)
