"""Experiments: a share of new turns runs on another version of the agent.

``Experiment("short-prompt", variants={"1": 0.8, "2": 0.2})`` on
``@kafka_agent(version="2", versions={"1": body_v1}, experiment=...)`` starts 80% of new
turns on version 1 and 20% on version 2. The variant is the agent version a turn starts
on, so it is journaled in the turn's start step, carried by every event (``version``)
and by every score (``agent_version``), and a pinned turn finishes on it wherever it
resumes.

A turn's variant is a hash of its key (the thread id, else the turn id) salted by the
experiment's name: deterministic, so every worker, and any retry of the start, picks the
same variant, and a thread's turns all stay on one side. Every variant must be a version
the agent's code has (``version`` or a key of ``versions``): every worker of that code
can run every variant, so the partition a turn lands on never decides which version
runs it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyrula_stream.errors import AgentRegistrationError

_SCALE = float(1 << 64)


@dataclass(frozen=True)
class Experiment:
    """Shares of new turns per agent version; ``variants`` maps a version to its share
    (shares are positive and add up to 1)."""

    name: str
    variants: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise AgentRegistrationError("Experiment: name must be non-empty text")
        if len(self.variants) < 2:
            raise AgentRegistrationError(
                f"experiment {self.name!r}: needs at least two variants (versions), "
                f"got {dict(self.variants)}"
            )
        for version, share in self.variants.items():
            if not isinstance(version, str) or not version:
                raise AgentRegistrationError(
                    f"experiment {self.name!r}: variant {version!r} must be a version name (text)"
                )
            if isinstance(share, bool) or not isinstance(share, int | float) or not share > 0:
                raise AgentRegistrationError(
                    f"experiment {self.name!r}: variant {version!r} has share {share!r}; "
                    "a share is a number > 0"
                )
        total = sum(self.variants.values())
        if not math.isclose(total, 1.0, abs_tol=1e-9):
            raise AgentRegistrationError(
                f"experiment {self.name!r}: the shares add up to {total:g}, not 1"
            )

    def variant_for(self, key: str) -> str:
        """The variant of the turn keyed ``key``: the same on every worker, every time."""
        digest = hashlib.sha256(f"{self.name}\x00{key}".encode()).digest()
        point = int.from_bytes(digest[:8], "big") / _SCALE
        cumulative = 0.0
        ordered = sorted(self.variants.items())  # the order code declares them in must not matter
        for version, share in ordered:
            cumulative += share
            if point < cumulative:
                return version
        return ordered[-1][0]  # rounding at the top end


def check_experiment(
    agent: str, experiment: Experiment | None, version: str | None, versions: Mapping[str, object]
) -> str | None:
    """Why the agent cannot run ``experiment`` (``None``: it can)."""
    if experiment is None:
        return None
    if not isinstance(experiment, Experiment):
        return f"experiment= must be an Experiment, got {type(experiment).__name__}"
    known = {*versions, *([version] if version else [])}
    missing = sorted(set(experiment.variants) - known)
    if missing:
        return (
            f"experiment {experiment.name!r} routes turns to versions {missing} that this code "
            f"lacks (it has {sorted(known)}): name this body's version= and keep the others "
            "in versions={...}"
        )
    return None
