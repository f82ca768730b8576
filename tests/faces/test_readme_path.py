"""The newcomer's paths, run as written: the README's own-cluster path and the twenty lines
of Getting started, each file saved under the name its page gives, each command run in a
shell in turn.

A local broker (``pyrula-stream broker start`` against a temporary
``PYRULA_STREAM_CACHE``) stands in for the cluster, and a local server speaking OpenAI's
wire format (``pyrula_stream/testing_servers``, reached through ``OPENAI_BASE_URL``) for the
key. The install step is not run (no package index here): the test checks it names the ``openai``
extra, which this venv has. The worker, which the pages run in a second shell, runs in
the background; the next command starts once the agent's topics exist, as a person waits
for the worker to start. A turn the model refuses must fail with a readable
``TurnFailed``, not a ``KeyError`` on ``data["result"]``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from pyrula_stream.kafka.local.broker import fetch_jars
from pyrula_stream.testing_servers.openai_server import OpenAIWireServer

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```(?P<info>\w*)\n(?P<body>.*?)^```$", re.M | re.S)


@dataclass
class PagePath:
    """One page's path: the file it names and its commands (comments dropped)."""

    name: str
    source: str
    commands: list[str]


def page_path(page: str, heading: str) -> PagePath:
    text = (ROOT / page).read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    section = text[start : text.index("\n## ", start + 1)]
    blocks = {m["info"]: m["body"] for m in BLOCK.finditer(section)}
    source = blocks["python"]
    name = source.splitlines()[0].removeprefix("# ").strip()
    assert f"`{name}`" in section.split("```", 1)[0], "the page must name the file it runs"
    lines = [line.split("  #", 1)[0].strip() for line in blocks["console"].splitlines()]
    return PagePath(name, source, [c for c in lines if c])


@dataclass
class Shell:
    """The commands' shell: a project folder, the environment, what ``export`` set."""

    work: Path
    env: dict[str, str]
    exports: list[str] = field(default_factory=list)
    worker: subprocess.Popen[str] | None = None

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", "\n".join([*self.exports, command])],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
        )

    def start_worker(self, command: str, bootstrap: str) -> None:
        self.worker = subprocess.Popen(
            ["bash", "-c", "\n".join([*self.exports, f"exec {command}"])],
            cwd=self.work,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 90
        while not topic_exists(bootstrap, "pyrula.support.turns"):
            assert self.worker.poll() is None, self.worker.communicate()[0]
            assert time.monotonic() < deadline, "the worker made no topics in 90 s"
            time.sleep(0.5)


def topic_exists(bootstrap: str, topic: str) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return topic in admin.list_topics(timeout=5).topics


@pytest.fixture
def openai_server() -> Iterator[OpenAIWireServer]:
    with OpenAIWireServer() as server:
        yield server


@pytest.fixture
def shell(tmp_path: Path, openai_server: OpenAIWireServer) -> Iterator[Shell]:
    """A fresh project folder and cache; afterwards the worker and the broker stop."""
    work, cache = tmp_path / "project", tmp_path / "cache"
    work.mkdir()
    cache.mkdir()
    jars = fetch_jars()  # the shared jar cache; the broker's state goes to the temp cache
    (cache / jars.parent.name).symlink_to(jars.parent)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "PYRULA_", "OPENAI_"))
    }
    env |= {
        "PYRULA_STREAM_CACHE": str(cache),
        "OPENAI_BASE_URL": openai_server.base_url,
        "PYTHONPATH": str(ROOT),  # this checkout's code, as `pip install -e` of it gives
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    }
    sh = Shell(work, env)
    try:
        yield sh
    finally:
        if sh.worker is not None:
            sh.worker.terminate()
            sh.worker.communicate(timeout=60)  # closes its output pipe
        stopped = sh.run("pyrula-stream broker stop")
        assert stopped.returncode == 0, stopped.stderr


def follow(
    path: PagePath, sh: Shell, before_python: Callable[[], None] = lambda: None
) -> subprocess.CompletedProcess[str]:
    """Save the file, run every command; the last one's outcome."""
    (sh.work / path.name).write_text(path.source)
    bootstrap = ""
    done: subprocess.CompletedProcess[str] | None = None
    for command in path.commands:
        words = shlex.split(command)
        if words[:3] == ["pip", "install", "-e"]:
            assert words[3].endswith("[openai]"), command
            import openai  # noqa: F401  (the extra the step installs)

            continue
        if words[0] == "export":
            sh.exports.append(command)
            continue
        if words[:2] == ["pyrula-stream", "worker"]:
            sh.start_worker(command, bootstrap)
            continue
        if words[0] == "python":
            before_python()
        done = sh.run(command)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        if words[:3] == ["pyrula-stream", "broker", "start"]:
            bootstrap = done.stdout.strip().splitlines()[-1]
            assert "WARNING" not in done.stderr, done.stderr  # a fresh broker is no fault
    assert sh.worker is not None, "the path must start a worker"
    assert done is not None
    return done


def test_the_readme_path_runs_a_turn_and_a_failed_turn_reads(
    shell: Shell, openai_server: OpenAIWireServer
) -> None:
    path = page_path("README.md", "Twenty lines, on your own cluster, in five commands")
    assert len(path.commands) <= 5, path.commands
    turn = follow(path, shell, lambda: openai_server.reply_text("Order 9 has shipped."))
    assert turn.stdout.strip() == "Order 9 has shipped."
    sent = openai_server.requests[-1]
    assert sent.headers["authorization"] == "Bearer sk-..."  # the key step's value
    assert sent.body["messages"][-1]["content"] == "Where is order 9?"

    openai_server.reply_error(400, "The model `gpt-4.1-mini` does not exist.")
    failed = shell.run(path.commands[-1])
    assert failed.returncode != 0
    assert "KeyError" not in failed.stderr, failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"pyrula_stream\.errors\.TurnFailed: turn \S+ of agent 'support' failed with "
        r"llm_error: .*does not exist.*",
        last,
    ), failed.stderr


def test_the_twenty_lines_of_getting_started_run_as_written(shell: Shell) -> None:
    path = page_path("docs/getting-started.md", "Twenty lines")
    assert len(path.source.splitlines()) <= 24  # twenty lines, give or take the imports
    assert follow(path, shell).stdout.strip() == "It shipped."
