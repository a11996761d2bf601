"""The budget from recorded Mac, CUDA and CPU-only readings."""

import pytest

from mlxfit.errors import BadInput
from mlxfit.machine import PlatformReadings, build_machine, parse_reserve, read_platform
from conftest import CUDA_24GB, GB, LINUX_CPU, MAC_36GB


def test_mac_uses_metal_memory_size_and_a_quarter_reserve():
    m = build_machine(MAC_36GB)
    assert m.backend == "metal" and m.unified
    assert m.total_bytes == 38654705664
    assert m.reserve_bytes == 38654705664 // 4
    assert m.usable_bytes == m.total_bytes - m.reserve_bytes
    assert m.recommended_working_set_bytes == 28991029248


def test_mac_warns_when_apps_hold_more_than_the_reserve():
    (warning,) = [w for w in build_machine(MAC_36GB).warnings if "other programs" in w]
    assert "14.0 GB" in warning


def test_mac_warns_when_budget_exceeds_recommended_working_set():
    m = build_machine(MAC_36GB, reserve=0.1)
    assert any("recommended working set" in w for w in m.warnings)


def test_cuda_budget_is_gpu_memory_not_system_ram():
    m = build_machine(CUDA_24GB)
    assert not m.unified and m.backend == "cuda"
    assert m.total_bytes == 25757220864  # not the 128 GB of RAM
    assert m.used_bytes == 25757220864 - 25255673856
    assert m.reserve_bytes == int(25757220864 * 0.05)


def test_cpu_box_uses_system_ram():
    m = build_machine(LINUX_CPU)
    assert m.backend == "cpu" and m.unified
    assert m.total_bytes == LINUX_CPU.system_total
    assert m.warnings == ()


def test_hypothetical_memory_replaces_the_machine():
    m = build_machine(CUDA_24GB, memory=36 * GB)
    assert m.hypothetical and m.unified and m.total_bytes == 36 * GB
    assert m.usable_bytes == 27 * GB


@pytest.mark.parametrize("text, value", [("0.25", 0.25), ("10%", 0.10), ("8GB", 8 * GB)])
def test_parse_reserve(text, value):
    assert parse_reserve(text) == value


def test_reserve_as_size():
    assert build_machine(LINUX_CPU, reserve=8 * GB, memory=36 * GB).usable_bytes == 28 * GB


def test_reserve_larger_than_machine_is_refused():
    with pytest.raises(BadInput, match="leaves nothing"):
        build_machine(LINUX_CPU, reserve=40 * GB, memory=36 * GB)


def test_real_platform_read_works_here():
    readings = read_platform()
    assert isinstance(readings, PlatformReadings)
    assert readings.system_total > 0 and readings.backend in ("metal", "cuda", "cpu")
