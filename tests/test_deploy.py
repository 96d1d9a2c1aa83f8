"""deploy/: the manifests are valid against the Kubernetes schemas, pass the "restricted" Pod
Security Standard, and agree with each other and with the daemon; the image's health check, the
systemd unit and the shipped pod's confinement are checked for real where the host allows it."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kubernetes

from execbox_runner.daemon import machine
from execbox_runner.daemon.config import Settings
from execbox_runner.daemon.server import closing_time

from . import otheruser
from .daemonkit import certificate, children_of, client, run_to_done, running_daemon, stop

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
KUSTOMIZE = DEPLOY / "kubernetes"
OVERLAYS = sorted(path.name for path in (KUSTOMIZE / "overlays").iterdir())
# The oldest Kubernetes release still supported upstream when this was written, and the newest
# whose schemas kubernetes-validate ships (offline: the schemas are inside the package).
KUBERNETES_VERSIONS = ("1.31", kubernetes.latest_version())
# Kinds of cert-manager's (custom resources, which kubernetes-validate has no schema for).
CERT_MANAGER = {"Certificate", "Issuer"}


@functools.cache
def render(directory: Path) -> tuple[dict[str, Any], ...]:
    """What `kubectl kustomize DIRECTORY` renders (`kubectl apply -k` applies the same)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed: it renders the kustomizations (kubectl kustomize)")
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def manifests(overlay: str = "tls") -> dict[str, dict[str, Any]]:
    """What `kubectl apply -k deploy/kubernetes/overlays/OVERLAY` applies, by kind."""
    return {doc["kind"]: doc for doc in render(KUSTOMIZE / "overlays" / overlay)}


def pod(overlay: str = "tls") -> dict[str, Any]:
    spec: dict[str, Any] = manifests(overlay)["Deployment"]["spec"]["template"]["spec"]
    return spec


def container(overlay: str = "tls") -> dict[str, Any]:
    found: dict[str, Any] = pod(overlay)["containers"][0]
    return found


def env(overlay: str = "tls") -> dict[str, str]:
    return {item["name"]: item["value"] for item in container(overlay)["env"]}


def test_each_overlay_applies_every_kind_in_the_runners_own_namespace() -> None:
    assert OVERLAYS == ["hardened", "plain", "tls", "tls-cert-manager"]
    for overlay in OVERLAYS:
        kinds = manifests(overlay)
        extra = CERT_MANAGER if overlay == "tls-cert-manager" else set()
        assert set(kinds) == {
            "Namespace",
            "Deployment",
            "Service",
            "HorizontalPodAutoscaler",
            "PodDisruptionBudget",
            "NetworkPolicy",
            *extra,
        }
        namespace = kinds["Namespace"]["metadata"]
        assert namespace["name"] == "execbox-runner"  # not default, which is left as it is
        assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        for kind, doc in kinds.items():
            if kind != "Namespace":
                assert doc["metadata"]["namespace"] == "execbox-runner", (overlay, kind)


def test_the_image_is_named_in_one_place() -> None:
    """The base's kustomization names it; every overlay renders it; an overlay can point it elsewhere."""
    (image,) = yaml.safe_load((KUSTOMIZE / "base" / "kustomization.yaml").read_text())["images"]
    named = [path for path in KUSTOMIZE.rglob("*.yaml") if re.search(r"image: \S*execbox-runner:", path.read_text())]
    assert named == []  # no manifest states a tag: kustomize sets it
    for overlay in OVERLAYS:
        assert container(overlay)["image"] == f"{image['name']}:{image['newTag']}"


def test_an_overlay_of_ones_own_sets_the_image_and_keeps_the_rest(tmp_path: Path) -> None:
    """What the deploy docs tell an operator to write: the shipped overlay, the image from elsewhere."""
    overlay = tmp_path / "mine"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(KUSTOMIZE / "overlays" / "tls", overlay)],
                "images": [{"name": "execbox-runner", "newName": "registry.example/execbox-runner", "newTag": "9.9.9"}],
            }
        )
    )
    mine = {doc["kind"]: doc for doc in render(overlay)}
    deployment = mine["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert deployment["image"] == "registry.example/execbox-runner:9.9.9"
    deployment["image"] = container("tls")["image"]
    assert mine == manifests("tls")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_manifest_is_valid_against_the_kubernetes_schemas(overlay: str, version: str) -> None:
    checked = [doc for doc in render(KUSTOMIZE / "overlays" / overlay) if doc["kind"] not in CERT_MANAGER]
    assert len(checked) == 6
    for doc in checked:
        # strict: an unknown or misspelt field is an error, as `kubectl apply --validate=strict` makes it
        kubernetes.validate(doc, version, strict=True)
        assert doc["metadata"]["labels"]["app"] == "execbox-runner", doc["kind"]


def test_the_sessions_autoscaler_component_is_valid_and_aims_below_the_ceiling(tmp_path: Path) -> None:
    overlay = tmp_path / "sessions"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(KUSTOMIZE / "overlays" / "tls", overlay)],
                "components": [os.path.relpath(KUSTOMIZE / "components" / "active-sessions-hpa", overlay)],
            }
        )
    )
    autoscaler = {doc["kind"]: doc for doc in render(overlay)}["HorizontalPodAutoscaler"]
    for version in KUBERNETES_VERSIONS:
        kubernetes.validate(autoscaler, version, strict=True)
    (sessions,) = [m for m in autoscaler["spec"]["metrics"] if m["type"] == "Pods"]
    assert sessions["pods"]["metric"]["name"] == "execbox_active_sessions"
    assert int(sessions["pods"]["target"]["averageValue"]) * 2 == int(env()["EXECBOX_RUNNER_MAX_SESSIONS"])
    assert [m["resource"]["name"] for m in autoscaler["spec"]["metrics"] if m["type"] == "Resource"] == ["cpu"]


def test_cert_manager_makes_the_secret_the_pod_mounts_for_the_services_names() -> None:
    kinds = manifests("tls-cert-manager")
    certificate, issuer = kinds["Certificate"], kinds["Issuer"]
    assert certificate["apiVersion"] == issuer["apiVersion"] == "cert-manager.io/v1"
    volumes = {volume["name"]: volume for volume in pod("tls-cert-manager")["volumes"]}
    assert certificate["spec"]["secretName"] == volumes["tls"]["secret"]["secretName"]
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": issuer["metadata"]["name"]}
    service, namespace = kinds["Service"]["metadata"]["name"], kinds["Namespace"]["metadata"]["name"]
    assert certificate["spec"]["dnsNames"] == [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]
    assert {doc["kind"]: doc for doc in render(KUSTOMIZE / "overlays" / "tls")} == {
        kind: doc for kind, doc in kinds.items() if kind not in CERT_MANAGER
    }


def test_schema_validation_catches_what_yaml_parsing_does_not() -> None:
    deployment = json.loads(json.dumps(manifests()["Deployment"]))
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalaton"] = False
    with pytest.raises(kubernetes.ValidationError):
        kubernetes.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)
    deployment = json.loads(json.dumps(manifests()["Deployment"]))
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = ["4Gi"]
    with pytest.raises(kubernetes.ValidationError):
        kubernetes.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """The Pod Security Standards' baseline and restricted controls a pod spec breaks
    (https://kubernetes.io/docs/concepts/security/pod-security-standards/, v1.31)."""
    problems = [f"host namespace {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    pod_context = spec.get("securityContext", {})
    problems += [
        f"volume {v['name']} type" for v in spec.get("volumes", []) if not set(v) - {"name"} <= RESTRICTED_VOLUMES
    ]
    problems += [f"sysctl {s['name']}" for s in pod_context.get("sysctls", [])]
    if pod_context.get("runAsUser") == 0:
        problems.append("pod runAsUser 0")
    for each in spec.get("initContainers", []) + spec["containers"]:
        context = each.get("securityContext", {})
        name = each["name"]
        if context.get("privileged"):
            problems.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation must be false")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{name}: capabilities must drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: capabilities added {capabilities['add']}")
        if not context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot must be true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append(f"{name}: runAsUser 0")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost")
        if any(port.get("hostPort") for port in each.get("ports", [])):
            problems.append(f"{name}: hostPort")
        if context.get("procMount", "Default") != "Default":
            problems.append(f"{name}: procMount")
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_deployment_passes_the_restricted_pod_security_standard(overlay: str) -> None:
    assert restricted_violations(pod(overlay)) == []
    # The checker is not vacuous: what the pod would need for a network namespace breaks it.
    with_namespace = json.loads(json.dumps(pod()))
    context = with_namespace["containers"][0]["securityContext"]
    context.update(
        runAsUser=0, runAsNonRoot=False, capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN", "SETUID", "SETGID"]}
    )
    assert restricted_violations(with_namespace) == [
        "execbox-runner: capabilities added ['SYS_ADMIN', 'SETUID', 'SETGID']",
        "execbox-runner: runAsNonRoot must be true",
        "execbox-runner: runAsUser 0",
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_container_is_hardened_beyond_the_standard(overlay: str) -> None:
    spec, context = pod(overlay), container(overlay)["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsUser"] != 0
    mounts = {mount["mountPath"]: mount for mount in container(overlay)["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    # The only writable place: /tmp (prometheus' multiprocess directory, and --record-dir if set).
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert all(mount["readOnly"] for path, mount in mounts.items() if path != "/tmp")


def test_the_network_policy_lets_anyone_reach_sessions_prometheus_alone_metrics_and_nothing_out() -> None:
    policy = manifests()["NetworkPolicy"]["spec"]
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    assert policy["egress"] == []
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels().items()
    sessions, scrapes = policy["ingress"]
    assert set(sessions) == {"ports"}  # from anywhere (hosts; the kubelet's probes), but to this port only
    assert sessions["ports"] == [{"port": Settings().port, "protocol": "TCP"}]
    assert scrapes["ports"] == [{"port": int(env()["EXECBOX_RUNNER_METRICS_PORT"]), "protocol": "TCP"}]
    (source,) = scrapes["from"]  # one peer, selected by namespace and pod together: Prometheus
    assert set(source) == {"namespaceSelector", "podSelector"}
    assert all(selector["matchLabels"] for selector in source.values())


def pod_labels() -> dict[str, str]:
    labels: dict[str, str] = manifests()["Deployment"]["spec"]["template"]["metadata"]["labels"]
    return labels


def quantity(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "": 1}
    number, unit = re.fullmatch(r"(\d+)([A-Za-z]*)", text).groups()  # type: ignore[union-attr]
    return int(number) * units[unit]


def test_resources_agree_with_the_memory_budget_and_processes() -> None:
    resources, settings = container()["resources"], env()
    limit = quantity(resources["limits"]["memory"])
    assert quantity(resources["requests"]["memory"]) == limit  # never squeezed below what the budget assumes
    assert "EXECBOX_RUNNER_MEMORY_BUDGET_BYTES" not in settings  # the default: a share of the cgroup limit
    budget = machine.default_memory_budget(limit)
    processes = int(settings["EXECBOX_RUNNER_PROCESSES"])
    assert processes == machine.default_processes(int(resources["limits"]["cpu"]))
    per_guest = int(settings["EXECBOX_RUNNER_MAX_MEMORY_LIMIT_BYTES"])
    # Each daemon process gets a share of the budget: room for several guests at the cap each.
    assert budget // processes >= 4 * per_guest
    assert budget < limit  # the rest is headroom before the kernel's OOM killer
    # The emptyDir counts against ephemeral storage: it fits in the limit.
    tmp = next(v for v in pod()["volumes"] if v["name"] == "tmp")
    assert quantity(tmp["emptyDir"]["sizeLimit"]) <= quantity(resources["limits"]["ephemeral-storage"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_ports_and_drain_fit_the_daemon(overlay: str) -> None:
    spec, each, settings = pod(overlay), container(overlay), env(overlay)
    ports = {port["name"]: port["containerPort"] for port in each["ports"]}
    assert ports == {"ws": Settings().port, "metrics": int(settings["EXECBOX_RUNNER_METRICS_PORT"])}
    assert ports["metrics"] != ports["ws"]
    annotations = manifests(overlay)["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(ports["metrics"])  # scraped where the metrics are
    assert each["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert each["livenessProbe"]["httpGet"]["path"] == "/healthz"
    tls = overlay != "plain"
    assert tls == ("EXECBOX_RUNNER_CERTFILE" in settings)
    assert annotations["prometheus.io/scheme"] == ("https" if tls else "http")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        # On the sessions' port, which answers the probes without a token.
        assert each[probe]["httpGet"]["port"] == "ws"
        assert each[probe]["httpGet"]["scheme"] == ("HTTPS" if tls else "HTTP")
    drain = float(settings["EXECBOX_RUNNER_DRAIN_GRACE"])
    pause = int(each["lifecycle"]["preStop"]["exec"]["command"][-1])
    # SIGTERM comes after preStop; then the grace, and the sessions' closing (the Deployment keeps
    # the default timeouts); only the workers' exit, which no host sees, may be cut by the SIGKILL.
    assert spec["terminationGracePeriodSeconds"] >= pause + drain + closing_time(Settings())
    assert settings["EXECBOX_RUNNER_PROFILE"] == ("hardened" if overlay == "hardened" else "standard")
    mounts = [mount["mountPath"] for mount in each["volumeMounts"]]
    files = ["EXECBOX_RUNNER_TOKENS_FILE", *(["EXECBOX_RUNNER_CERTFILE", "EXECBOX_RUNNER_KEYFILE"] if tls else [])]
    for name in files:
        assert any(settings[name].startswith(mount + "/") for mount in mounts), name


def test_service_autoscalers_and_budget_point_at_the_deployment() -> None:
    kinds = manifests()
    assert kinds["Service"]["spec"]["selector"].items() <= pod_labels().items()
    assert kinds["Service"]["spec"]["ports"][0]["targetPort"] == container()["ports"][0]["name"]
    assert kinds["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= pod_labels().items()
    autoscaler = kinds["HorizontalPodAutoscaler"]
    target = autoscaler["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", kinds["Deployment"]["metadata"]["name"])
    # A PodDisruptionBudget of one unavailable pod leaves at least one serving.
    assert autoscaler["spec"]["minReplicas"] >= 2
    for constraint in pod()["topologySpreadConstraints"]:
        assert constraint["labelSelector"]["matchLabels"].items() <= pod_labels().items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_manifest_settings_are_accepted_by_the_daemon(overlay: str, tmp_path: Path) -> None:
    """`execbox-runner info` with the Deployment's environment (files made up): every value passes."""
    settings = env(overlay)
    (tmp_path / "tokens").write_text("a-token\n")
    settings.update(EXECBOX_RUNNER_TOKENS_FILE=str(tmp_path / "tokens"))
    if "EXECBOX_RUNNER_CERTFILE" in settings:
        certfile, keyfile, _ = certificate(tmp_path)
        settings.update(EXECBOX_RUNNER_CERTFILE=str(certfile), EXECBOX_RUNNER_KEYFILE=str(keyfile))
    done = subprocess.run(
        [sys.executable, "-m", "execbox_runner", "info", "--json", "--host", "0.0.0.0"],
        env={**os.environ, **settings},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["limits"]["max_sessions"] == int(settings["EXECBOX_RUNNER_MAX_SESSIONS"])
    assert report["limits"]["max_memory_limit_bytes"] == int(settings["EXECBOX_RUNNER_MAX_MEMORY_LIMIT_BYTES"])
    assert report["profile"] == settings["EXECBOX_RUNNER_PROFILE"]
    unsafe = set(report["unsafe_settings"]) - {"no_network_namespace"}  # where this host cannot give one
    assert unsafe == ({"no_tls"} if overlay == "plain" else set())


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in (raw.strip() for raw in text.splitlines())
        if line and not line.startswith("#")
    ]


def test_the_dockerfile_is_multi_stage_pinned_non_root_and_health_checked() -> None:
    instructions = dockerfile_instructions()
    stages = [arguments for kind, arguments in instructions if kind == "FROM"]
    assert len(stages) == 2 and stages[0].endswith(" AS build")
    base = next(
        arguments for kind, arguments in instructions if kind == "ARG" and arguments.startswith("PYTHON_IMAGE=")
    )
    assert re.fullmatch(r"PYTHON_IMAGE=python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base)
    final = instructions[max(i for i, (kind, _) in enumerate(instructions) if kind == "FROM") :]
    user = [arguments for kind, arguments in final if kind == "USER"]
    assert user == ["65532:65532"]
    assert user[0].split(":")[0] == str(pod()["securityContext"]["runAsUser"])
    assert any(kind == "HEALTHCHECK" and "healthcheck.py" in arguments for kind, arguments in final)
    (entrypoint,) = [json.loads(arguments) for kind, arguments in final if kind == "ENTRYPOINT"]
    assert entrypoint == ["execbox-runner", "serve"]  # where it listens comes from variables, which flags override
    environment = " ".join(arguments for kind, arguments in final if kind == "ENV").split()
    assert {"EXECBOX_RUNNER_HOST=0.0.0.0", f"EXECBOX_RUNNER_PORT={Settings().port}"} <= set(environment)
    assert not any("tini" in arguments or "dumb-init" in arguments for _, arguments in instructions)


def test_the_image_build_stage_builds_the_wheel_from_what_it_copies(tmp_path: Path) -> None:
    """The build stage's COPYs, replayed into an empty directory (WORKDIR /src), then its pip step:
    the wheel builds from exactly what the image copies (pyproject.toml needs LICENSE, the
    conformance kit and the transcripts). No container engine needed."""
    repository, source = DEPLOY.parent, tmp_path / "src"
    source.mkdir()
    build = dockerfile_instructions()
    stages = [i for i, (kind, _) in enumerate(build) if kind == "FROM"]
    build = build[stages[0] : stages[1]]
    for kind, arguments in build:
        if kind != "COPY":
            continue
        *sources, destination = arguments.split()
        for item in sources:
            assert (repository / item).exists(), item
            if destination.startswith("/"):
                continue  # into the virtualenv, not the build directory
            target = source / destination / Path(item).name if destination.endswith("/") else source / destination
            if (repository / item).is_dir():
                shutil.copytree(repository / item, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(repository / item, target)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert list((tmp_path / "dist").glob("execbox_runner-*.whl"))


def healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEPLOY / "healthcheck.py")],
        env={**os.environ, **env},
        timeout=30,
        capture_output=True,
        text=True,
    )


def free_port() -> int:
    """A port nothing listens on now (for a daemon's --metrics-port, which cannot pick one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_the_image_health_check_over_http_and_https(tmp_path: Path) -> None:
    certfile, keyfile, _ = certificate(tmp_path)
    with running_daemon() as daemon:
        port = daemon.url.rsplit(":", 1)[1].strip("/")
        assert healthcheck({"EXECBOX_RUNNER_HEALTHCHECK_PORT": port}).returncode == 0
        # A certificate named but plain HTTP served (TLS turned off by a flag): HTTPS, then HTTP.
        assert (
            healthcheck({"EXECBOX_RUNNER_HEALTHCHECK_PORT": port, "EXECBOX_RUNNER_CERTFILE": str(certfile)}).returncode
            == 0
        )
    assert healthcheck({"EXECBOX_RUNNER_HEALTHCHECK_PORT": port}).returncode == 1  # stopped: nobody listens
    for wrong in ("abc", "0", "70000"):  # unhealthy, in one line rather than a traceback
        done = healthcheck({"EXECBOX_RUNNER_HEALTHCHECK_PORT": wrong})
        assert (done.returncode, done.stderr) == (
            1,
            f"healthcheck: invalid EXECBOX_RUNNER_HEALTHCHECK_PORT '{wrong}': must be a port number 1-65535\n",
        )
    # With the metrics elsewhere and behind a token, the sessions' port still answers the check.
    with running_daemon("--metrics-port", str(free_port()), "--metrics-token", "m") as daemon:
        port = daemon.url.rsplit(":", 1)[1].strip("/")
        assert healthcheck({"EXECBOX_RUNNER_HEALTHCHECK_PORT": port}).returncode == 0
    assert healthcheck({"EXECBOX_RUNNER_HEALTHCHECK_PORT": port}).returncode == 1  # stopped: nobody listens
    with running_daemon("--certfile", str(certfile), "--keyfile", str(keyfile)) as daemon:
        port = daemon.url.rsplit(":", 1)[1].strip("/")
        assert (
            healthcheck({"EXECBOX_RUNNER_HEALTHCHECK_PORT": port, "EXECBOX_RUNNER_CERTFILE": str(certfile)}).returncode
            == 0
        )
        # TLS set by a flag after the image's name (or a --config file), no variable: HTTP, then HTTPS.
        assert healthcheck({"EXECBOX_RUNNER_HEALTHCHECK_PORT": port}).returncode == 0
    assert healthcheck({"EXECBOX_RUNNER_HEALTHCHECK_PORT": port}).returncode == 1  # stopped: nobody listens


def unit() -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / "execbox-runner.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            values.setdefault(key, []).append(value)
    return values


def test_the_systemd_unit_is_hardened_but_lets_workers_confine_themselves() -> None:
    values = unit()
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "ProtectHome": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
        "KillMode": "mixed",  # SIGTERM to the daemon only, which drains and stops its workers
        "RestartPreventExitStatus": "2",
    }.items():
        assert values[key] == [value], key
    # What the workers' own confinement needs, and nothing more:
    assert values["CapabilityBoundingSet"] == ["CAP_SYS_ADMIN CAP_SETUID CAP_SETGID"]  # netns, drop to nobody
    assert values["RestrictNamespaces"] == ["net"]  # the workers' empty network namespace
    assert set(values["RestrictAddressFamilies"][0].split()) == {"AF_INET", "AF_INET6", "AF_UNIX"}
    assert values["SystemCallFilter"] == ["@system-service seccomp"]  # each worker installs its own filter
    assert "MemoryDenyWriteExecute" not in values  # see the unit: ctypes callbacks need a W+X page
    assert values["User"] == ["root"]
    assert int(values["TimeoutStopSec"][0]) >= Settings().drain_grace + closing_time(Settings())


def test_the_units_example_config_is_accepted_by_the_daemon(tmp_path: Path) -> None:
    """deploy/systemd/runner.toml, its files made up: every value passes, and the budget is 80% of MemoryMax."""
    (tmp_path / "tokens").write_text("a-token\n")
    certfile, keyfile, _ = certificate(tmp_path)
    text = (DEPLOY / "systemd" / "runner.toml").read_text()
    (tmp_path / "metrics-token").write_text("a-metrics-token\n")
    files = {"tokens": tmp_path / "tokens", "metrics-token": tmp_path / "metrics-token"}
    for name, path in {**files, "cert.pem": certfile, "key.pem": keyfile}.items():
        text = text.replace(f"/etc/execbox-runner/{name}", str(path))
    config = tmp_path / "runner.toml"
    config.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "execbox_runner", "info", "--json", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["unsafe_settings"] in ([], ["no_network_namespace"])  # the latter when not root
    memory_max = quantity(unit()["MemoryMax"][0] + "i")
    assert report["memory_budget_bytes"] == machine.default_memory_budget(memory_max)


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    text = (DEPLOY / "systemd" / "execbox-runner.service").read_text()
    # verify wants ExecStart's program to exist: point it at this environment's.
    program = Path(sys.executable).parent / "execbox-runner"
    path = tmp_path / "execbox-runner.service"
    path.write_text(text.replace("/opt/execbox-runner/bin/execbox-runner", str(program)))
    done = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    # verify exits 0 even for unknown keys and bad values: any output is a finding.
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    path.write_text(text + "ProtectSystm=strict\n")
    done = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert "Unknown key" in done.stderr  # the check is not vacuous


def test_systemd_analyze_security_rates_the_unit_ok(tmp_path: Path) -> None:
    """The unit's exposure score (0 best, 10 worst), offline (systemd 250 and later)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    program = Path(sys.executable).parent / "execbox-runner"
    path = tmp_path / "execbox-runner.service"
    text = (DEPLOY / "systemd" / "execbox-runner.service").read_text()
    path.write_text(text.replace("/opt/execbox-runner/bin/execbox-runner", str(program)))
    done = subprocess.run(
        [analyze, "security", "--offline=true", str(path)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    score = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout)
    if score is None:
        pytest.skip(f"systemd-analyze security --offline is not supported here: {done.stderr.strip()[:200]}")
    # 2.8 when written: root with three capabilities is the cost of the workers' confinement.
    assert float(score.group(1)) <= 3.0, done.stdout


# The shipped pod, emulated with the kernel's own tools: a new PID namespace (the daemon is PID 1,
# no init), a private mount namespace whose root and /work are read-only with a tmpfs on /tmp (the
# emptyDir), and the daemon started as uid 65532 with no capabilities and no_new_privs (what
# runAsUser, drop ALL and allowPrivilegeEscalation: false give). Root only; nothing outside changes.
EMULATED_POD = (
    otheruser.REACH
    + r"""
set -e
mount --make-rprivate /
mount -t tmpfs -o mode=0755 tmpfs /run  # staging places for the binds below, in this namespace only
mkdir -p /run/execbox-pod-config && mount --bind "$CONFIG" /run/execbox-pod-config
reach /run/execbox-pod-keep  # this checkout and its interpreter, for the pod's user (otheruser.py)
mount --bind / / && mount -o remount,bind,ro /
for writable in $(findmnt -rn -o TARGET | grep -v '^/$' | grep -v '^/proc' | grep -v '^/dev' | grep -v '^/sys'); do
    mount -o remount,bind,ro "$writable" 2>/dev/null || true
done
mount -t tmpfs -o size=64m,mode=1777 tmpfs /tmp
reach_back /run/execbox-pod-keep  # again, for those that lived in /tmp
mount -t proc proc /proc
exec setpriv --reuid 65532 --regid 65532 --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs \
    env HOME=/nonexistent "$PYTHON" -m execbox_runner serve "$@"
"""
)


def emulation_possible() -> str | None:
    if os.geteuid() != 0:
        return "needs root (to make the namespaces and drop to the pod's user)"
    for tool in ("unshare", "setpriv", "findmnt"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    trial = (
        "mount --make-rprivate / && mount -t tmpfs tmpfs /run && mount -t proc proc /proc && setpriv --reuid 65532 true"
    )
    probe = subprocess.run(["unshare", "-m", "-p", "-f", "sh", "-c", trial], capture_output=True, timeout=30)
    return None if probe.returncode == 0 else f"mount and PID namespaces are not allowed here: {probe.stderr[-200:]!r}"


def get(url: str, context: ssl.SSLContext) -> dict[str, Any]:
    with urllib.request.urlopen(url, context=context, timeout=10) as answer:
        loaded: dict[str, Any] = json.loads(answer.read())
        return loaded


def test_the_shipped_pod_runs_non_root_read_only_as_pid_1(tmp_path: Path) -> None:
    """What the restricted pod leaves of the confinement, and that the daemon works in it."""
    reason = emulation_possible()
    if reason:
        pytest.skip(reason)
    config = tmp_path / "config"
    config.mkdir(mode=0o755)
    (config / "tokens").write_text("pod-token\n")
    _, _, trusted = certificate(config)
    for path in config.iterdir():
        path.chmod(0o444)
    paths = otheruser.needed()
    closed = otheruser.closed_tree(paths)
    if closed:
        pytest.fail(f"the pod's user cannot run this checkout: {closed}")
    settings = {**env(), "CONFIG": str(config), "PYTHON": sys.executable}
    settings.update(otheruser.environment(paths, Path("/run/execbox-pod-keep")))
    settings.update(
        EXECBOX_RUNNER_TOKENS_FILE="/run/execbox-pod-config/tokens",
        EXECBOX_RUNNER_CERTFILE="/run/execbox-pod-config/tls.crt",
        EXECBOX_RUNNER_KEYFILE="/run/execbox-pod-config/tls.key",
        EXECBOX_RUNNER_DRAIN_GRACE="5",
        EXECBOX_RUNNER_METRICS_PORT=str(free_port()),  # the pod's own network; here the host's
    )
    process = subprocess.Popen(
        [
            "unshare",
            "-m",
            "-p",
            "-f",
            "--kill-child",
            "sh",
            "-c",
            EMULATED_POD,
            "pod",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ],
        env={**os.environ, **settings},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # bounded: the daemon exits if it cannot start
        found = re.search(r"listening on (wss://\S+)", line)
        if not found:
            stop(process)
            assert process.stderr is not None
            pytest.fail(f"the emulated pod did not start: {line!r}\n{process.stderr.read()[-3000:]}")
        assert found
        url = found.group(1)
        https = url.replace("wss://", "https://").rstrip("/")
        deadline = time.monotonic() + 30
        while get(https + "/readyz", trusted).get("status") != "ready" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert get(https + "/healthz", trusted) == {"status": "alive"}  # the probes' port tells nothing more
        metrics_port = settings["EXECBOX_RUNNER_METRICS_PORT"]
        health = get(f"https://127.0.0.1:{metrics_port}/healthz", trusted)
        protections = {name: value["enforced"] for name, value in health["protections"].items()}
        # The kernel boundary that remains: seccomp, no_new_privs, rlimits, closed descriptors.
        assert protections == {
            "seccomp": True,
            "no_new_privs": True,
            # Refused: in a real pod by the RuntimeDefault seccomp profile, here because the bind
            # mount makes the kernel see a chroot. The one thing the restricted pod costs.
            "network_namespace": False,
            "drop_privileges": False,  # nothing to drop: the daemon is not root
            "rlimits": True,
            "close_inherited_fds": True,
        }
        assert health["unsafe_settings"] == ["no_network_namespace"]
        with client(url, ssl=trusted, additional_headers={"Authorization": "Bearer pod-token"}) as ws:
            assert run_to_done(ws, "pod", "await tools.echo(6 * 7)")["result"] == 42
        daemon = int(subprocess.check_output(["pgrep", "-P", str(process.pid)], text=True).split()[0])
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{daemon}/status").read_text().splitlines())
        assert status["NSpid"].split()[-1] == "1"  # PID 1 of its namespace, as in a container
        assert status["Uid"].split() == ["65532"] * 4
        assert (int(status["CapEff"], 16), int(status["CapBnd"], 16), status["NoNewPrivs"]) == (0, 0, "1")
        # Its root filesystem is read-only, /tmp (the emptyDir) is not: seen through its own root.
        root = Path(f"/proc/{daemon}/root")
        for place in ("", "work", "etc"):
            with pytest.raises(OSError, match="Read-only file system"):
                (root / place / "execbox-pod-write-probe").touch()
        (root / "tmp" / "execbox-pod-write-probe").touch()
        # PID 1 with no init: SIGTERM (as `docker stop` or the kubelet sends it) drains and exits 0.
        os.kill(daemon, signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        # The pod's PID 1 first (its end ends the namespace): setpriv's change of user cleared the
        # parent-death signal of unshare's --kill-child, so stopping unshare alone may leave it
        # running (a failed run here once left the pod's daemon serving for hours).
        for pod in children_of(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pod, signal.SIGKILL)
        stop(process)
        assert process.stderr is not None
        print(process.stderr.read()[-20_000:])  # the daemon's log, shown if the test failed
