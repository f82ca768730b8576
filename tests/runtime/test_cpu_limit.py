"""``--processes auto`` counts the cores the container may use (its cgroup CPU quota),
not the node's: cgroup files written in a temporary root, read as the kernel writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyrula_stream.runtime.cpu_limit import cgroup_cpu_quota, cpu_limit, own_cgroup, usable_cores
from pyrula_stream.runtime.supervisor import process_count


def _files(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "max 100000"}, None),
        ({"cpu.max": "200000 100000"}, 2.0),
        ({"cpu.max": "50000 100000"}, 0.5),
        ({"cpu.max": "150000"}, 1.5),  # the period defaults to the kernel's 100 ms
        ({"cpu.max": "garbage here"}, None),
        ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
        ({"cpu/cpu.cfs_quota_us": "300000", "cpu/cpu.cfs_period_us": "100000"}, 3.0),
        ({"cpu,cpuacct/cpu.cfs_quota_us": "25000", "cpu,cpuacct/cpu.cfs_period_us": "50000"}, 0.5),
        ({}, None),
    ],
)
def test_quota_from_cgroup_v2_and_v1_files(
    tmp_path: Path, files: dict[str, str], quota: float | None
) -> None:
    assert cgroup_cpu_quota(_files(tmp_path, files)) == quota


def test_a_fraction_of_a_core_is_one_process(tmp_path: Path) -> None:
    root = _files(tmp_path, {"cpu.max": "50000 100000"})
    assert cpu_limit(root) == 1
    assert process_count("auto", cgroup_root=root) == 1


def test_the_quota_rounds_up_and_never_passes_the_usable_cores(tmp_path: Path) -> None:
    cores = usable_cores()
    root = _files(tmp_path / "a", {"cpu.max": f"{(cores - 1) * 100000 + 1} 100000"})
    assert cpu_limit(root) == cores  # ceil: 1.00001 cores of quota is 2 processes
    many = _files(tmp_path / "b", {"cpu.max": f"{(cores + 8) * 100000} 100000"})
    assert process_count("auto", cgroup_root=many) == cores


def test_no_limit_counts_the_usable_cores(tmp_path: Path) -> None:
    root = _files(tmp_path, {"cpu.max": "max 100000"})
    assert process_count("auto", cgroup_root=root) == usable_cores()


def test_an_explicit_count_ignores_the_quota(tmp_path: Path) -> None:
    root = _files(tmp_path, {"cpu.max": "50000 100000"})
    assert process_count("3", cgroup_root=root) == 3
    with pytest.raises(ValueError, match="--processes"):
        process_count("0", cgroup_root=root)


def test_without_a_cgroup_namespace_the_tightest_limit_on_the_way_up_counts(
    tmp_path: Path,
) -> None:
    """A container whose cgroup is ``/kubepods/pod1/ctr`` under the host's root: its own
    ``cpu.max`` says no limit, the pod's above it says 1.5 cores."""
    root = _files(
        tmp_path,
        {
            "kubepods/pod1/ctr/cpu.max": "max 100000",
            "kubepods/pod1/cpu.max": "150000 100000",
            "kubepods/cpu.max": "max 100000",
        },
    )
    assert cgroup_cpu_quota(root, "/kubepods/pod1/ctr") == 1.5
    assert cgroup_cpu_quota(root, "/") is None, "the root has no cpu.max: v1 then, none"
    assert process_count("auto", cgroup_root=root, own_cgroup="/kubepods/pod1/ctr") == min(
        2, usable_cores()
    )


def test_own_cgroup_reads_the_v2_line(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/x\n1:cpu:/\n0::/kubepods/pod1/ctr\n")
    assert own_cgroup(proc) == "/kubepods/pod1/ctr"
    proc.write_text("1:cpu:/\n")
    assert own_cgroup(proc) == "/"
    assert own_cgroup(tmp_path / "missing") == "/"
