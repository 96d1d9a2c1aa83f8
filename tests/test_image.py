"""The production image (deploy/Dockerfile), built with podman on a base made from Debian's packages,
run as the deploy docs say: it becomes ready (in how long is printed), passes the conformance kit over TLS, runs as
uid 65532 on a read-only root with the daemon as PID 1, keeps guest code off the network (each
worker in a user and network namespace of its own, under podman's default seccomp profile), and on
SIGTERM drains and exits 0 within the drain grace. The kustomized Deployment runs under
`podman kube play` and serves executions over the TLS its one-liner makes.

Root only (podman as root); the image is built once per session (containerkit)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from websockets.exceptions import InvalidStatus

from . import containerkit
from .daemonkit import children_of, client, execute, receive, run_to_done
from .test_userns import enter_network_of, namespace, status

TOKEN = "image-token"
PORT = 8765  # the image's sessions' port
READY_TIMEOUT_S = 60.0  # how long the tests wait for /readyz
DRAIN_GRACE_S = 5
USER = 65532
KUSTOMIZE = containerkit.DEPLOY / "kubernetes"


# The first test builds the image, which may take its two builds' time.
pytestmark = pytest.mark.timeout(2 * containerkit.BUILD_TIMEOUT_S + 300)


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    try:
        yield containerkit.build()
    finally:
        containerkit.remove_images()


@dataclass
class Served:
    container: containerkit.Container
    url: str
    context: ssl.SSLContext
    authority: Path
    ready_after_s: float

    def connect(self) -> Any:
        return client(self.url, ssl=self.context, additional_headers={"Authorization": f"Bearer {TOKEN}"})


def secrets(directory: Path) -> tuple[Path, Path, ssl.SSLContext]:
    """``directory/secrets`` with tokens, tls.crt and tls.key (for 127.0.0.1), readable by the
    image's user alone; the authority's certificate, and a client context that trusts it."""
    folder = directory / "secrets"
    folder.mkdir(mode=0o755)
    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1", "localhost")
    (folder / "tokens").write_text(TOKEN + "\n")
    issued.cert_chain_pems[0].write_to_path(str(folder / "tls.crt"))
    issued.private_key_pem.write_to_path(str(folder / "tls.key"))
    for path in folder.iterdir():
        os.chown(path, USER, USER)
        path.chmod(0o400)
    ca = directory / "ca.pem"
    authority.cert_pem.write_to_path(str(ca))
    return folder, ca, ssl.create_default_context(cafile=str(ca))


def documented_run(image: str, port: int, folder: Path, *extra: str) -> list[str]:
    """The deploy docs' `podman run` (less --detach and --name), on a port of this test's."""
    return [
        "--read-only",
        "--tmpfs",
        "/tmp",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--publish",
        f"127.0.0.1:{port}:{PORT}",
        "--volume",
        f"{folder}:/etc/execbox-runner:ro",
        "--env",
        "EXECBOX_RUNNER_TOKENS_FILE=/etc/execbox-runner/tokens",
        "--env",
        "EXECBOX_RUNNER_CERTFILE=/etc/execbox-runner/tls.crt",
        "--env",
        "EXECBOX_RUNNER_KEYFILE=/etc/execbox-runner/tls.key",
        *extra,
        image,
    ]


def readiness(base: str, context: ssl.SSLContext) -> str:
    """``ready``, ``draining`` (or another status), or what kept the probe from an answer."""
    try:
        with urllib.request.urlopen(base + "/readyz", context=context, timeout=2) as answer:
            return str(json.loads(answer.read())["status"])
    except urllib.error.HTTPError as exc:
        return str(json.loads(exc.read()).get("status", exc.code))
    except (OSError, ValueError) as exc:
        return f"no answer: {exc}"


def wait_ready(base: str, context: ssl.SSLContext, since: float, timeout: float = READY_TIMEOUT_S) -> float:
    """Seconds from ``since`` until /readyz answered ready."""
    last = ""
    while time.monotonic() < since + timeout:
        last = readiness(base, context)
        if last == "ready":
            return time.monotonic() - since
        time.sleep(0.05)
    raise AssertionError(f"not ready within {timeout} s: {last}")


@contextlib.contextmanager
def served_container(image: str, directory: Path, name: str, *extra: str) -> Iterator[Served]:
    folder, ca, context = secrets(directory)
    port = containerkit.free_port()
    started = time.monotonic()
    with containerkit.running(name, *documented_run(image, port, folder, *extra)) as container:
        ready_after = wait_ready(f"https://127.0.0.1:{port}", context, started)
        yield Served(container, f"wss://127.0.0.1:{port}/", context, ca, ready_after)


@pytest.fixture(scope="module")
def served(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served_container(image, tmp_path_factory.mktemp("image"), "served") as running:
        yield running


def test_the_documented_run_becomes_ready(served: Served, record_property: Callable[[str, object], None]) -> None:
    """From `podman run` to /readyz answering ready: the container's start, the daemon's, its warm workers.

    Nothing here is timed beyond the wait's own bound: the seconds it took are printed (``-s``) and
    kept in the JUnit report, and the performance page quotes them."""
    print(f"documented run ready after {served.ready_after_s:.2f} s")
    record_property("ready_after_s", round(served.ready_after_s, 2))
    assert served.ready_after_s < READY_TIMEOUT_S


def test_the_image_passes_the_conformance_kit_over_tls(served: Served) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "execbox_runner_conformance",
            served.url,
            "--token",
            TOKEN,
            "--cafile",
            str(served.authority),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["passed"] > 0 and report["failed"] == 0, report


def test_the_daemon_is_pid_1_as_its_user_on_a_read_only_root(served: Served) -> None:
    daemon = served.container.pid()
    found = status(daemon)
    assert found["NSpid"].split()[-1] == "1"
    assert found["Uid"].split() == [str(USER)] * 4
    assert (int(found["CapEff"], 16), int(found["CapBnd"], 16), found["NoNewPrivs"]) == (0, 0, "1")
    root = Path(f"/proc/{daemon}/root")
    for place in ("", "opt/execbox-runner", "etc"):
        with pytest.raises(OSError, match="Read-only file system"):
            (root / place / "execbox-image-write-probe").touch()
    (root / "tmp" / "execbox-image-write-probe").touch()


def test_guest_code_in_the_container_is_off_the_network(served: Served) -> None:
    """`execbox-runner info` in the container reports the workers' namespace made in a user
    namespace; each worker's network has no way out, not even to the daemon's own port, which the
    container's network reaches."""
    done = served.container.exec("execbox-runner", "info", "--json")
    report = json.loads(done.stdout)
    assert report["network_mechanism"] == "userns+netns"
    assert report["protections"]["network_namespace"] == {"requested": True, "enforced": True}
    assert report["unsafe_settings"] == []
    with served.connect() as ws:
        assert run_to_done(ws, "net", "await tools.echo(6 * 7)")["result"] == 42
        daemon = served.container.pid()
        workers = [pid for zygote in children_of(daemon) for pid in children_of(zygote)]
        assert workers
        for worker in workers:
            assert status(worker)["Uid"].split() == [str(USER)] * 4
            for kind in ("user", "net"):
                assert namespace(worker, kind) != namespace(daemon, kind), kind
            assert enter_network_of(worker, ("127.0.0.1", PORT)) == "ENETUNREACH"
        assert enter_network_of(daemon, ("127.0.0.1", PORT)) == "connected"


def test_sigterm_drains_and_exits_0_within_the_drain_grace(image: str, tmp_path: Path) -> None:
    """`podman stop`'s SIGTERM: readiness fails at once, new sessions get 503, an execution answered
    during the drain completes, one that never ends gets its `done` (timeout) at the drain grace,
    and the container exits 0 before the grace is much over (not killed at podman's timeout)."""
    drain = f"EXECBOX_RUNNER_DRAIN_GRACE={DRAIN_GRACE_S}"
    with served_container(image, tmp_path, "drain", "--env", drain) as running, running.connect() as answered:
        base = running.url.replace("wss://", "https://").rstrip("/")
        with running.connect() as stuck:
            answered.send(execute("answered", "await tools.echo(41) + 1", timeoutMs=60_000))
            stuck.send(execute("stuck", "await tools.hang({})", timeoutMs=60_000))
            for ws in (answered, stuck):
                assert receive(ws)["type"] == "started"
            call = receive(answered)
            assert receive(stuck)["type"] == "tool_call"
            signalled = time.monotonic()
            stopping = threading.Thread(
                target=containerkit.podman, args=("stop", "--time", str(DRAIN_GRACE_S + 20), running.container.name)
            )
            stopping.start()
            deadline = signalled + 10
            while readiness(base, running.context) != "draining" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert readiness(base, running.context) == "draining"
            with pytest.raises(InvalidStatus, match="503"), running.connect():
                pass
            answered.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": 41}))
            assert receive(answered)["result"] == 42
            done = receive(stuck, timeout=DRAIN_GRACE_S + 10)
            assert (done["id"], done["error"]["code"]) == ("stuck", "timeout")
        stopping.join(DRAIN_GRACE_S + 30)
        assert running.container.wait(timeout=30) == 0
        assert time.monotonic() - signalled < DRAIN_GRACE_S + 5


# The deploy docs' one-liner for the TLS Secret, in the Service's names (components/tls).
SERVICE_NAME = "execbox-runner.execbox-runner.svc"
ONE_LINER = [
    "openssl",
    "req",
    "-x509",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-days",
    "365",
    "-keyout",
    "tls.key",
    "-out",
    "tls.crt",
    "-subj",
    f"/CN={SERVICE_NAME}",
    "-addext",
    f"subjectAltName=DNS:{SERVICE_NAME},DNS:{SERVICE_NAME}.cluster.local",
]


def kubectl(*args: str, cwd: Path) -> str:
    done = subprocess.run([tool("kubectl"), *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def tool(name: str) -> str:
    """The path of ``name``, or the test fails saying it is missing."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: the kube play test runs it as the deploy docs do")
    return found


class NamedContext(ssl.SSLContext):
    """A client context that checks the server's certificate for ``name`` wherever it connects (a
    Service's name, reached here through a published port on 127.0.0.1)."""

    name = ""

    def wrap_socket(self, sock: Any, *args: Any, **kwargs: Any) -> Any:
        return super().wrap_socket(sock, *args, **{**kwargs, "server_hostname": self.name})


def test_the_kustomized_deployment_runs_under_podman_kube_play(image: str, tmp_path: Path) -> None:
    """overlays/tls rendered with this session's image in an overlay of the test's own, the Secrets
    made as the docs make them (the one-liner, `kubectl create secret`), then played by podman: the
    pod runs as the manifests say and serves over their TLS, with their tokens.

    podman plays pods, containers, env, volumes and hostPort; the Service, probes and policies are
    checked against the schemas in test_deploy.py. What the test changes for podman 4.3: one
    replica (it plays each, and they would share the host port), the local image never pulled, the
    secret volumes marked required (it fails on an unset `optional`), and the Secrets handed over
    as podman secrets of their decoded text (it writes a played Secret's data still base64-encoded).
    Names get this session's suffix, so that concurrent sessions never meet."""
    assert subprocess.run([tool(ONE_LINER[0]), *ONE_LINER[1:]], cwd=tmp_path, timeout=60).returncode == 0
    (tmp_path / "tokens").write_text(TOKEN + "\n")
    repository, tag = image.rsplit(":", 1)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(KUSTOMIZE / "overlays" / "tls", overlay)],
                "images": [{"name": "execbox-runner", "newName": repository, "newTag": tag}],
            }
        )
    )
    rendered = {doc["kind"]: doc for doc in yaml.safe_load_all(kubectl("kustomize", str(overlay), cwd=tmp_path))}
    deployment = rendered["Deployment"]
    suffix = containerkit.SESSION
    deployment["metadata"]["name"] += f"-{suffix}"
    deployment["spec"]["replicas"] = 1
    spec = deployment["spec"]["template"]["spec"]
    (each,) = spec["containers"]
    assert each["image"] == image
    each["imagePullPolicy"] = "Never"  # the local image; a cluster pulls it from the registry
    port = containerkit.free_port()
    next(p for p in each["ports"] if p["name"] == "ws").update(hostPort=port, hostIP="127.0.0.1")
    secrets = {}
    for volume in spec["volumes"]:
        if "secret" in volume:
            secrets[volume["secret"]["secretName"]] = volume["secret"]["secretName"] + f"-{suffix}"
            volume["secret"].update(secretName=secrets[volume["secret"]["secretName"]], optional=False)
    made = [
        kubectl("create", "secret", "tls", "execbox-runner-tls", "--cert=tls.crt", "--key=tls.key",
                "--dry-run=client", "-o", "yaml", cwd=tmp_path),
        kubectl("create", "secret", "generic", "execbox-runner-tokens", "--from-file=tokens=tokens",
                "--dry-run=client", "-o", "yaml", cwd=tmp_path),
    ]  # fmt: skip
    played = tmp_path / "played.yaml"
    played.write_text(yaml.safe_dump(deployment))
    context = NamedContext(ssl.PROTOCOL_TLS_CLIENT)
    context.name = SERVICE_NAME
    context.load_verify_locations(cafile=str(tmp_path / "tls.crt"))
    created: list[str] = []
    try:
        for text in made:
            secret = yaml.safe_load(text)
            name = secrets[secret["metadata"]["name"]]  # KeyError: a Secret the Deployment does not mount
            secret["metadata"]["name"] = name
            secret["data"] = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
            (tmp_path / name).write_text(yaml.safe_dump(secret))
            containerkit.podman("secret", "create", name, str(tmp_path / name))
            created.append(name)
        assert sorted(created) == sorted(secrets.values())
        containerkit.podman("kube", "play", str(played), timeout=180)
        wait_ready(f"https://127.0.0.1:{port}", context, time.monotonic())
        url = f"wss://127.0.0.1:{port}/"
        with client(url, ssl=context, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as session:
            assert run_to_done(session, "kube", "await tools.echo(6 * 7)")["result"] == 42
        with pytest.raises(InvalidStatus, match="401"), client(url, ssl=context):
            pass  # the tokens Secret is in force
        runner = containerkit.Container(f"{deployment['metadata']['name']}-pod-0-{each['name']}")
        daemon = runner.pid()
        found = status(daemon)
        assert found["Uid"].split() == [str(USER)] * 4
        assert (int(found["CapEff"], 16), found["NoNewPrivs"]) == (0, "1")
        with pytest.raises(OSError, match="Read-only file system"):
            (Path(f"/proc/{daemon}/root") / "execbox-kube-write-probe").touch()
        environment = dict(
            line.split("=", 1) for line in Path(f"/proc/{daemon}/environ").read_text().split("\0") if "=" in line
        )
        assert {item["name"]: item["value"] for item in each["env"]}.items() <= environment.items()
    finally:
        containerkit.podman("kube", "down", str(played), timeout=120, check=False)
        for name in created:
            containerkit.podman("secret", "rm", name, check=False)
