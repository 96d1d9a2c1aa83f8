"""deploy/: the manifests are valid YAML and agree with each other and with the daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from execbox_runner.daemon.config import Settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def manifests() -> dict[str, dict[str, Any]]:
    documents = [
        doc
        for path in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    return {doc["kind"]: doc for doc in documents}


def test_every_manifest_is_valid_yaml_with_the_expected_kinds() -> None:
    assert set(manifests()) == {"Deployment", "Service", "HorizontalPodAutoscaler"}


def test_probes_ports_and_drain_fit_the_daemon() -> None:
    kinds = manifests()
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    port = container["ports"][0]
    assert port["containerPort"] == Settings().port
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {item["name"]: item["value"] for item in container["env"]}
    drain = float(env["EXECBOX_RUNNER_DRAIN_GRACE"])
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > drain + pause  # SIGTERM comes after preStop
    assert env["EXECBOX_RUNNER_PROFILE"] in ("standard", "hardened")
    assert env["EXECBOX_RUNNER_TOKENS_FILE"].startswith(container["volumeMounts"][0]["mountPath"])


def test_service_and_autoscaler_point_at_the_deployment() -> None:
    kinds = manifests()
    labels = kinds["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert kinds["Service"]["spec"]["selector"].items() <= labels.items()
    assert (
        kinds["Service"]["spec"]["ports"][0]["targetPort"]
        == kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"]
    )
    target = kinds["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", kinds["Deployment"]["metadata"]["name"])


def test_the_dockerfile_runs_the_daemon_on_all_interfaces() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["execbox-runner", "serve", "--host", "0.0.0.0"' in dockerfile
    assert "pip install --no-cache-dir ." in dockerfile
