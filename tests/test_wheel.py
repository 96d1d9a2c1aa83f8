"""The wheel as users get it: built from this tree, installed with its dependencies into a fresh venv.

The daemon and the conformance kit then run from that venv, from ``/``, so
nothing of the source tree (the editable install, the working directory) can
stand in for what the wheel ships.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .daemonkit import _listening_url, stop

REPO = Path(__file__).resolve().parent.parent
STEP_TIMEOUT_S = 180


def run(*command: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S
    )
    assert completed.returncode == 0, f"{command}: {completed.stdout[-2000:]}\n{completed.stderr[-2000:]}"
    return completed


def new_files() -> set[str]:
    """Untracked and ignored entries of the source tree: where a build would leave build/, *.egg-info, dist/.

    Tracked files are left out on purpose: a build does not edit them, and
    people working in this tree do, while this test runs.
    """
    status = run("git", "status", "--porcelain", "--ignored", cwd=REPO).stdout
    return {line for line in status.splitlines() if line.startswith(("??", "!!"))}


def test_the_wheel_installs_into_a_fresh_venv_and_its_daemon_passes_the_kit(tmp_path: Path) -> None:
    before = new_files()
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", dist, ".", cwd=REPO)
    assert new_files() == before, "building the wheel left files in the source tree"

    (wheel,) = dist.glob("execbox_runner-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert all(name.split("/")[0].startswith("execbox_runner") for name in names), sorted(
        {name.split("/")[0] for name in names}
    )
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    kit = "execbox_runner_conformance/"
    assert {f"{kit}{path.name}" for path in (REPO / "conformance").glob("*.py")} <= set(names)
    shipped = {name.removeprefix(f"{kit}transcripts/") for name in names if name.startswith(f"{kit}transcripts/")}
    builtin = {path.name for path in (REPO / "transcripts").glob("*.jsonl")}
    assert shipped == builtin | {"README.md"}

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheel, cwd=tmp_path)  # with its dependencies

    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    root = Path("/")
    where = run(
        venv / "bin" / "python",
        "-c",
        "import sys, execbox_runner, execbox_runner_conformance.cli\n"
        "print(execbox_runner.__file__); print(execbox_runner_conformance.__file__)\n"
        "print(' '.join(sorted({name.split('.')[0] for name in sys.modules})))",
        cwd=root,
        env=env,
    ).stdout.splitlines()
    assert all(Path(path).is_relative_to(venv) for path in where[:2]), where
    modules = set(where[2].split())
    assert "websockets" in modules
    assert not modules & {"trio", "msgspec", "quickjs", "tree_sitter", "prometheus_client"}, (
        "the kit needs only websockets"
    )

    with tempfile.TemporaryFile(mode="w+") as stderr:
        daemon = subprocess.Popen(
            [str(venv / "bin" / "execbox-runner"), "serve", "--host", "127.0.0.1", "--port", "0"],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            url = _listening_url(daemon, stderr)
            kit_run = subprocess.run(
                [str(venv / "bin" / "execbox-conformance"), url, "--json"],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                timeout=STEP_TIMEOUT_S,
            )
        finally:
            stop(daemon)
            assert daemon.stdout is not None
            daemon.stdout.close()
    assert kit_run.returncode == 0, kit_run.stderr[-3000:]
    report = json.loads(kit_run.stdout)
    assert report["ok"] is True and report["failed"] == 0
    assert report["passed"] == len(builtin)
    assert {f"{result['name']}.jsonl" for result in report["results"]} == builtin
    assert all(result["builtin"] and Path(result["file"]).is_relative_to(venv) for result in report["results"])
    assert kit_run.stderr.strip().splitlines()[-1] == f"{len(builtin)} passed, 0 failed"
