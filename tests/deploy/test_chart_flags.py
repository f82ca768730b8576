"""The Helm chart passes the CLI flags it names: a renamed or removed flag fails here, not
in a cluster (``make deploy-check`` renders and validates the chart itself)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from pyrula_stream.cli import build_parser

TEMPLATES = Path(__file__).resolve().parent.parent.parent / "deploy/helm/pyrula-stream/templates"
FLAG = re.compile(r"^\s*- (--[a-z][a-z-]*)", re.M)
SHELL_FLAG = re.compile(r"(--[a-z][a-z-]*)")


def _options(*command: str) -> set[str]:
    parser = build_parser()
    for name in command:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return {s for a in parser._actions for s in a.option_strings}


@pytest.mark.parametrize(
    ("template", "command"),
    [("worker.yaml", ("worker",)), ("gateway.yaml", ("gateway",)), ("ui.yaml", ("ui",))],
)
def test_every_flag_a_template_passes_exists(template: str, command: tuple[str, ...]) -> None:
    flags = set(FLAG.findall((TEMPLATES / template).read_text()))
    assert flags, f"no flags found in {template}"
    assert flags - _options(*command) == set()


def test_the_topics_job_runs_commands_that_take_its_flags() -> None:
    job = (TEMPLATES / "topics-job.yaml").read_text()
    topics = {
        f for line in job.splitlines() if "topics apply" in line for f in SHELL_FLAG.findall(line)
    }
    acls = {f for line in job.splitlines() if "principal" in line for f in SHELL_FLAG.findall(line)}
    assert topics and acls
    assert topics - _options("topics") == set()
    assert acls - _options("acls") == set()
