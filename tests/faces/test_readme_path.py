"""The README's own-cluster path, run as written: its file saved under the name it gives,
its commands run one by one in a shell.

A local broker (``pyrula-stream broker start`` against a temporary
``PYRULA_STREAM_CACHE``) stands in for the cluster, and a local server speaking OpenAI's
wire format (``tests/llm/servers``, reached through ``OPENAI_BASE_URL``) for the key. The
install step is not run (no package index here): the test checks it names the ``openai``
extra, which this venv has. The worker step, which the README runs in a second shell,
runs in the background; the next step starts once the agent's topics exist, as a person
waits for the worker to start. A second turn that the model refuses must fail with a
readable ``TurnFailed``, not a ``KeyError`` on ``data["result"]``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from pyrula_stream.kafka.local.broker import fetch_jars
from tests.llm.servers.openai_server import OpenAIWireServer

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Twenty lines, on your own cluster, in five commands"
BLOCK = re.compile(r"^```(?P<info>\w*)\n(?P<body>.*?)^```$", re.M | re.S)


def readme_path() -> tuple[str, str, list[str]]:
    """The section's file name, the file's text, and its commands (comments dropped)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    section = text[start : text.index("\n## ", start + 1)]
    blocks = {m["info"]: m["body"] for m in BLOCK.finditer(section)}
    source = blocks["python"]
    name = source.splitlines()[0].removeprefix("# ").strip()
    assert f"Save this as `{name}`" in section, "the section must name the file it runs"
    commands = [line.split("  #", 1)[0].strip() for line in blocks["console"].splitlines()]
    return name, source, [c for c in commands if c]


@pytest.fixture
def openai_server() -> Iterator[OpenAIWireServer]:
    with OpenAIWireServer() as server:
        yield server


def topic_exists(bootstrap: str, topic: str) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return topic in admin.list_topics(timeout=5).topics


def test_the_readme_path_runs_a_turn_and_a_failed_turn_reads(
    tmp_path: Path, openai_server: OpenAIWireServer
) -> None:
    name, source, commands = readme_path()
    assert len(commands) <= 5, commands
    work = tmp_path / "project"
    work.mkdir()
    (work / name).write_text(source)
    cache = tmp_path / "cache"
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
    exports: list[str] = []
    worker: subprocess.Popen[str] | None = None
    ran: dict[str, subprocess.CompletedProcess[str]] = {}

    def shell(command: str) -> subprocess.CompletedProcess[str]:
        script = "\n".join([*exports, command])
        return subprocess.run(
            ["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=180
        )

    try:
        for command in commands:
            words = shlex.split(command)
            if words[:3] == ["pip", "install", "-e"]:
                assert words[3].endswith("[openai]"), command
                import openai  # noqa: F401  (the extra the step installs)

                continue
            if words[0] == "export":
                exports.append(command)
                continue
            if words[:2] == ["pyrula-stream", "worker"]:
                worker = subprocess.Popen(
                    ["bash", "-c", "\n".join([*exports, f"exec {command}"])],
                    cwd=work,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                bootstrap = ran["pyrula-stream broker start"].stdout.strip().splitlines()[-1]
                deadline = time.monotonic() + 90
                while not topic_exists(bootstrap, "pyrula.support.turns"):
                    assert worker.poll() is None, worker.communicate()[0]
                    assert time.monotonic() < deadline, "the worker made no topics in 90 s"
                    time.sleep(0.5)
                continue
            if words[0] == "python":
                openai_server.reply_text("Hello from your own model.")
            ran[command] = done = shell(command)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
        assert worker is not None, "the path must start a worker"
        turn = commands[-1]
        assert ran[turn].stdout.strip() == "Hello from your own model."
        sent = openai_server.requests[-1]
        assert sent.headers["authorization"] == "Bearer sk-..."  # the key step's value
        assert sent.body["messages"][-1]["content"] == "Where is order 9?"

        openai_server.reply_error(400, "The model `gpt-4.1-mini` does not exist.")
        failed = shell(turn)
        assert failed.returncode != 0
        assert "KeyError" not in failed.stderr, failed.stderr
        last = failed.stderr.strip().splitlines()[-1]
        assert re.fullmatch(
            r"pyrula_stream\.errors\.TurnFailed: turn \S+ of agent 'support' failed with "
            r"llm_error: .*does not exist.*",
            last,
        ), failed.stderr
    finally:
        if worker is not None:
            worker.terminate()
            worker.communicate(timeout=60)  # closes its output pipe
        stopped = shell("pyrula-stream broker stop")
        assert stopped.returncode == 0, stopped.stderr
