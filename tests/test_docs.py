"""The documentation: the site builds strict, its runnable snippets run, its links stay in the repository.

A fenced block is runnable when the line before its opening fence is ``<!-- runnable -->``:
``python`` blocks run with this interpreter, ``sh`` blocks with bash, both from a directory that
looks like a checkout (``examples``, ``deploy`` and ``.venv`` linked in, so writes stay out of
the repository). A block that names ``127.0.0.1:8765`` talks to the daemon of the README's first
command: the test starts one on a free port and rewrites the address.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conformance.cli import build_parser as kit_parser  # the checkout's, which the installed kit copies
from execbox_runner import client

from .daemonkit import running_daemon

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
ROOT_PAGES = [REPO / name for name in ("README.md", "CHANGELOG.md", "SECURITY.md", "CONTRIBUTING.md")]
MARK = "<!-- runnable -->"
README_ADDRESS = "127.0.0.1:8765"
SNIPPET_TIMEOUT_S = 180
FENCE = re.compile(r"^(\s*)```(\w*)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int
    language: str
    text: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def snippets(page: Path) -> list[Snippet]:
    """The runnable blocks of a page, in order."""
    lines = page.read_text().splitlines()
    found = []
    for number, line in enumerate(lines):
        opening = FENCE.match(line)
        if opening is None or number == 0 or lines[number - 1].strip() != MARK:
            continue
        indent, language = opening.groups()
        end = next(i for i in range(number + 1, len(lines)) if lines[i].strip() == "```")
        body = "\n".join(text.removeprefix(indent) for text in lines[number + 1 : end])
        found.append(Snippet(page, number + 1, language, body + "\n"))
    return found


RUNNABLE = {page: found for page in PAGES if (found := snippets(page))}


def checkout_like(directory: Path) -> Path:
    """A directory where snippets written for the repository root run, writing nothing into it."""
    for name in ("examples", "deploy", "transcripts"):
        (directory / name).symlink_to(REPO / name)
    (directory / ".venv").symlink_to(Path(sys.prefix))
    return directory


def run(snippet: Snippet, directory: Path, address: str) -> None:
    text = snippet.text.replace(README_ADDRESS, address)
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if snippet.language == "python":
        command = [sys.executable, "-c", text]
    elif snippet.language in ("sh", "bash", "shell"):
        command = ["bash", "-euo", "pipefail", "-c", text]
    else:
        raise AssertionError(f"{snippet}: runnable blocks are python or sh, not {snippet.language!r}")
    done = subprocess.run(
        command, cwd=directory, env=environment, capture_output=True, text=True, timeout=SNIPPET_TIMEOUT_S
    )
    assert done.returncode == 0, (
        f"{snippet} exited {done.returncode}\n{text}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    )


def test_there_are_runnable_snippets_in_the_readme_and_the_docs() -> None:
    assert REPO / "README.md" in RUNNABLE
    assert len(RUNNABLE) > 3


@pytest.mark.parametrize("page", list(RUNNABLE), ids=lambda page: str(page.relative_to(REPO)))
def test_every_runnable_snippet_runs_as_written(page: Path, tmp_path: Path) -> None:
    """A page's snippets run in order in one directory, as a reader runs them."""
    directory = checkout_like(tmp_path)
    with contextlib.ExitStack() as stack:
        address = README_ADDRESS
        if any(README_ADDRESS in snippet.text for snippet in RUNNABLE[page]):
            address = stack.enter_context(running_daemon()).url.removeprefix("ws://").rstrip("/")
        for snippet in RUNNABLE[page]:
            run(snippet, directory, address)


def test_the_runnable_python_snippets_pass_mypy_strict(tmp_path: Path) -> None:
    """What a reader copies into a strictly typed project type-checks against the checkout's package;
    not the snippets of the MCP SDK's client, whose result content a snippet would have to narrow."""
    python = [snippet for found in RUNNABLE.values() for snippet in found if snippet.language == "python"]
    checked = [snippet for snippet in python if "from mcp import" not in snippet.text]
    assert len(checked) > len(python) / 2
    for number, snippet in enumerate(checked):
        (tmp_path / f"snippet_{number}.py").write_text(f"# {snippet}\n{snippet.text}")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), "."],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=SNIPPET_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_site_builds_without_a_warning(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    assert (tmp_path / "site" / "reference" / "configuration.html").is_file()


def test_the_python_api_reference_has_every_public_name_of_the_client() -> None:
    reference = (REPO / "docs" / "reference" / "python-api.md").read_text()
    documented = set(re.findall(r"^::: execbox_runner\.client\.(\w+)$", reference, re.MULTILINE))
    assert sorted(set(client.__all__) - documented) == []


@pytest.mark.parametrize("page", ROOT_PAGES, ids=lambda page: page.name)
def test_links_of_the_top_level_pages_stay_in_the_repository_and_resolve(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        assert "://" not in target and not target.startswith("mailto:"), f"{page.name} links outside: {target}"
        path = target.split("#", 1)[0]
        assert not path or (page.parent / path).exists(), f"{page.name}: {target} does not exist"


def test_the_docs_link_nowhere_outside_the_repository() -> None:
    for page in (REPO / "docs").rglob("*.md"):
        outside = [target for target in LINK.findall(page.read_text()) if "://" in target]
        assert not outside, f"{page.relative_to(REPO)} links outside the repository: {outside}"


def test_the_readme_is_a_landing_page() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 220
    assert max(len(line) for line in lines) <= 200


def test_ci_runs_the_readmes_test_command() -> None:
    """The README's second command is the one `.ci/run` runs on a clean clone."""
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.DOTALL)
    install_and_serve, tests = blocks[0].strip(), blocks[1].strip()
    assert install_and_serve.endswith("execbox-runner serve")
    assert "build.py" not in install_and_serve  # a first run needs no C toolchain
    assert tests in (REPO / ".ci" / "run").read_text()


def test_the_readme_names_every_tool_the_suite_needs() -> None:
    """A newcomer who runs the README's test command on a fresh machine is told beforehand what the
    suite needs beside Python: every tool `.ci/run` installs for it, and kubectl."""
    ci = (REPO / ".ci" / "run").read_text()
    installed = re.search(r"for tool in ([^;]+);", ci)
    assert installed is not None, "`.ci/run` no longer lists the tools it installs"
    tools = {entry.split(":")[0] for entry in installed.group(1).split()} | {"kubectl"}
    for page in ("README.md", "CONTRIBUTING.md"):
        text = (REPO / page).read_text()
        assert "as root" in text, page
        assert not [tool for tool in tools if f"`{tool}`" not in text], page


def test_the_kits_guide_lists_every_option_of_the_command() -> None:
    """transcripts/README.md's option table, which docs/how-to/conformance.md shows, against the
    command's own parser (the checkout's, which the installed kit is a copy of)."""
    options = {
        option
        for action in kit_parser()._actions
        for option in action.option_strings
        if option.startswith("-") and option not in ("-h", "--help")
    }
    guide = (REPO / "transcripts" / "README.md").read_text()
    listed = set(re.findall(r"^\| `(-[-\w]+)", guide, re.MULTILINE))
    assert listed == options
