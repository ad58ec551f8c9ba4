"""Host counters from real psutil plus fake kernel files (PSI, InfiniBand, cgroups)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.host import HostReader, parse_psi
from tests.conftest import FIXTURES, FakeClock


def _ib(sys_root: Path, hca: str, port: int, rcv_words: int, xmit_words: int) -> None:
    counters = sys_root / "class" / "infiniband" / hca / "ports" / str(port) / "counters"
    counters.mkdir(parents=True, exist_ok=True)
    (counters / "port_rcv_data").write_text(f"{rcv_words}\n")
    (counters / "port_xmit_data").write_text(f"{xmit_words}\n")


def _cgroup(root: Path, path: str, usage_usec: int, cpu_max: str | None = None) -> None:
    d = root / path.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.stat").write_text(f"usage_usec {usage_usec}\nuser_usec 1\nsystem_usec 1\n")
    if cpu_max:
        (d / "cpu.max").write_text(cpu_max + "\n")


def test_pressure_comes_from_the_kernel_files() -> None:
    host = HostReader("n", proc_root=FIXTURES / "proc", sys_root=Path("/nonexistent"))
    sample, _ = host.sample(1.0)
    assert sample.psi_cpu_some_ratio == pytest.approx(0.125)
    assert sample.psi_io_some_ratio == pytest.approx(0.412)
    assert sample.psi_io_full_ratio == pytest.approx(0.3575)
    assert sample.psi_memory_full_ratio == 0.0
    assert sample.memory_available_bytes and sample.memory_available_bytes > 0


def test_missing_pressure_is_none_not_zero(tmp_path: Path) -> None:
    host = HostReader("n", proc_root=tmp_path, sys_root=tmp_path)
    sample, _ = host.sample(1.0)
    assert sample.psi_cpu_some_ratio is None
    assert parse_psi("garbage", "some") is None


def test_cpu_ratios_need_two_readings() -> None:
    host = HostReader("n", proc_root=FIXTURES / "proc", sys_root=Path("/nonexistent"))
    first, _ = host.sample(1.0)
    assert first.cpu_busy_ratio is None
    # Burn CPU until the kernel's counters (10 ms ticks) have surely moved: a fixed amount of
    # work can finish inside one tick on a fast machine, and the test then flaked.
    started = time.process_time()
    while time.process_time() - started < 0.05:
        sum(i * i for i in range(10_000))
    second, _ = host.sample(2.0)
    assert second.cpu_busy_ratio is not None and 0.0 <= second.cpu_busy_ratio <= 1.0


def test_infiniband_rates_in_bytes_and_resets(tmp_path: Path, clock: FakeClock) -> None:
    sys_root = tmp_path / "sys"
    _ib(sys_root, "mlx5_0", 1, rcv_words=1000, xmit_words=0)
    host = HostReader("n", proc_root=tmp_path, sys_root=sys_root)
    _, net = host.sample(clock())
    assert next(n for n in net if n.kind == "ib").rx_bytes_per_second is None
    clock.advance(2)
    _ib(sys_root, "mlx5_0", 1, rcv_words=1000 + 2 * 250_000_000, xmit_words=10)
    _, net = host.sample(clock())
    (ib,) = [n for n in net if n.kind == "ib"]
    assert ib.device == "mlx5_0/1"
    assert ib.rx_bytes_per_second == pytest.approx(1e9)  # 4-byte words: 250M words/s = 1 GB/s
    assert ib.tx_bytes_per_second == pytest.approx(20.0)
    clock.advance(1)
    _ib(sys_root, "mlx5_0", 1, rcv_words=5, xmit_words=20)  # counter reset: no negative rate
    _, net = host.sample(clock())
    (ib,) = [n for n in net if n.kind == "ib"]
    assert ib.rx_bytes_per_second is None
    assert ib.tx_bytes_per_second == pytest.approx(40.0)  # 10 words in 1 s


def test_cgroup_cpu_cores_and_limit(tmp_path: Path, clock: FakeClock) -> None:
    cg_root = tmp_path / "cgroup"
    path = "/slurm/uid_1001/job_41823/step_0/task_0"
    _cgroup(cg_root, path, 0, cpu_max="400000 100000")
    host = HostReader("n", proc_root=tmp_path, sys_root=tmp_path, cgroup_root=cg_root)
    (first,) = host.cgroups(clock(), [path, path])
    assert first.cpu_cores is None and first.cpu_limit_cores == 4.0
    clock.advance(5)
    _cgroup(cg_root, path, 5 * 3_500_000)
    (second,) = host.cgroups(clock(), [path])
    assert second.cpu_cores == pytest.approx(3.5)
