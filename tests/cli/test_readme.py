"""CLI tier: the README's commands, run as a reader would run them.

Every fenced block of the README that a reader is meant to act on carries a marker
comment just above it, ``<!-- readme-test: ACTION ... -->``:

- ``file NAME``: the block is a file the reader writes (to a fresh directory here);
- ``run [cwd=repo] [expect="REGEX"]``: a shell command, run with bash; it must exit 0
  (and print something matching REGEX);
- ``background PORT``: a server the reader starts in another terminal; it runs until the
  test ends, and the next commands wait until it listens;
- ``covered-by PATH``: a command another test or CI step runs (make test, sam deploy);
  PATH must exist.

Every ``bash`` block needs a marker, so a command added to the README without a test fails
here. The one liberty taken: the README's fixed sandbox port is swapped for a free one,
so the walkthrough can run beside other tests.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.waiting import wait_for

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
_MARKED_BLOCK = re.compile(r"<!-- readme-test: (?P<marker>.+?) -->\n```(?P<lang>\w*)\n(?P<body>.*?)\n```", re.S)
_BLOCK = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)\n```", re.S | re.M)


@dataclass(frozen=True)
class Step:
    action: str
    argument: str
    options: dict[str, str]
    lang: str
    body: str


def readme_steps(text: str) -> list[Step]:
    steps = []
    for match in _MARKED_BLOCK.finditer(text):
        action, *rest = shlex.split(match["marker"])
        argument = "" if not rest or "=" in rest[0] else rest.pop(0)
        options = dict(part.split("=", 1) for part in rest)
        steps.append(Step(action, argument, options, match["lang"], match["body"]))
    return steps


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def reader_env() -> dict[str, str]:
    """A shell as after ``source .venv/bin/activate``, with no settings of ours leaking in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SW_", "AWS_", "PYTEST_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(BIN.parent)
    env["COLUMNS"] = "100"
    return env


@pytest.fixture
def background() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_every_command_in_the_readme_has_a_test() -> None:
    text = README.read_text()
    marked = {m.start("lang") - len("```") for m in _MARKED_BLOCK.finditer(text)}
    unmarked = [m["body"].splitlines()[0] for m in _BLOCK.finditer(text)
                if m["lang"] == "bash" and m.start() not in marked]
    assert unmarked == []
    actions = {step.action for step in readme_steps(text)}
    assert actions <= {"file", "run", "background", "covered-by"}, actions


def test_what_covers_the_rest_exists() -> None:
    covered = [step.argument for step in readme_steps(README.read_text()) if step.action == "covered-by"]
    assert covered
    assert [path for path in covered if not (ROOT / path).exists()] == []


def test_the_readme_runs_as_written(tmp_path: Path, reader_env: dict[str, str],
                                    background: list[subprocess.Popen[bytes]]) -> None:
    """Quickstart's demo, then the first-handler walkthrough: write the files, start the
    sandbox, run the worker on it, run the handler's test."""
    ports: dict[str, str] = {}

    def localise(command: str) -> str:
        for fixed, free in ports.items():
            command = command.replace(fixed, free)
        return command

    ran = 0
    for step in readme_steps(README.read_text()):
        if step.action == "file":
            (tmp_path / step.argument).write_text(step.body + "\n")
        elif step.action == "background":
            port = str(free_port())
            ports[step.argument] = port
            command = localise(step.body.split("#", 1)[0].strip()) + f" --port {port}"
            log = (tmp_path / f"background-{port}.log").open("wb")
            background.append(subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=tmp_path, env=reader_env,
                                               stdout=log, stderr=subprocess.STDOUT))
            wait_for(lambda p=int(port): listening(p) or background[-1].poll() is not None,
                     what=f"{command!r} to listen")
            assert background[-1].poll() is None, (tmp_path / f"background-{port}.log").read_text()
        elif step.action == "run":
            cwd = ROOT if step.options.get("cwd") == "repo" else tmp_path
            result = subprocess.run(["bash", "-eo", "pipefail", "-c", localise(step.body)], cwd=cwd, env=reader_env,
                                    capture_output=True, text=True, timeout=240, check=False)
            shown = f"$ {step.body}\n{result.stdout}\n{result.stderr}"
            assert result.returncode == 0, shown
            if "expect" in step.options:
                assert re.search(step.options["expect"], result.stdout + result.stderr), shown
            ran += 1
    assert ran >= 3


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_the_readme_and_docs_resolve() -> None:
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]  # contributing/ too
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)
                if anchor not in {_slug(h) for h in headings}:
                    broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []
