"""How many cores this process may use: the container's CPU limit, not the node's cores.

``os.cpu_count()`` counts the node's cores; a pod limited to 2 CPUs on a 64-core node
that starts 64 workers has them throttled in turn by the kernel (the CFS quota), each
with a share of a core too small to keep its sessions alive. The limit lives in the
cgroup: ``cpu.max`` (v2: ``"max 100000"`` or ``"200000 100000"``, quota and period in
microseconds) or ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` (v1, quota ``-1`` for
none). The count is the quota over the period rounded up, at least 1, and never more
than the cores the process may run on (its affinity mask).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cores() -> int:
    """Cores the scheduler lets this process run on (its affinity), else the node's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, own: str = "/") -> float | None:
    """The CPU limit in cores under ``root`` (cgroup v2, else v1), or None when unlimited.

    ``own`` is this process's cgroup v2 path (``own_cgroup``): a container with its own
    cgroup namespace sees ``/``, one without sees its path below the host's root. The
    tightest ``cpu.max`` from there up to ``root`` is the limit (a pod's may sit above its
    container's).
    """
    v2 = [
        _read(folder / "cpu.max")
        for folder in (root / own.strip("/"), *(root / own.strip("/")).parents)
        if folder.is_relative_to(root)
    ]
    if any(text is not None for text in v2):
        quotas = [_v2_quota(text) for text in v2 if text is not None]
        return min((q for q in quotas if q is not None), default=None)
    for folder in (root / "cpu", root / "cpu,cpuacct", root):
        v1_quota = _read(folder / "cpu.cfs_quota_us")
        v1_period = _read(folder / "cpu.cfs_period_us")
        if v1_quota is not None and v1_period is not None:
            return _ratio(v1_quota, v1_period)
    return None


def own_cgroup(proc_file: Path = Path("/proc/self/cgroup")) -> str:
    """This process's cgroup v2 path (the ``0::`` line), ``/`` when there is none."""
    text = _read(proc_file) or ""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return "/"


def cpu_limit(root: Path = CGROUP_ROOT, own: str | None = None) -> int:
    """Whole cores this process may use: ceil(quota), at least 1, at most ``usable_cores``."""
    cores = usable_cores()
    quota = cgroup_cpu_quota(root, own_cgroup() if own is None else own)
    if quota is None:
        return cores
    return max(1, min(cores, math.ceil(quota)))


def _v2_quota(text: str) -> float | None:
    quota, _, period = text.partition(" ")
    return None if quota == "max" else _ratio(quota, period or "100000")


def _ratio(quota_text: str, period_text: str) -> float | None:
    try:
        quota, period = float(quota_text), float(period_text)
    except ValueError:  # a file we do not understand limits nothing
        return None
    if quota <= 0 or period <= 0:  # v1 says -1 for no limit
        return None
    return quota / period


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return None
