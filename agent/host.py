"""The host adapter: the only module that imports ``psutil``.

It reads CPU times (with iowait and steal), load, memory, disk bytes and NIC bytes through psutil,
and what psutil does not cover straight from the kernel's files under injectable roots:

* pressure stall information, ``/proc/pressure/{cpu,io,memory}`` (avg10, as a ratio);
* InfiniBand port counters, ``/sys/class/infiniband/<hca>/ports/<n>/counters/port_{rcv,xmit}_data``.
  RDMA bypasses the kernel's network stack, so psutil's NIC counters never see it. The kernel
  counts these in units of 4 bytes (``Documentation/ABI/stable/sysfs-class-infiniband``);
* per-cgroup CPU, ``cpu.stat`` ``usage_usec`` (cgroup v2) or ``cpuacct.usage`` in ns (v1), and the
  limit from ``cpu.max``.

Counters become rates from the difference with the previous reading. A counter that went
backwards (reset, wrap, device replaced) gives ``None`` for that tick, not a negative rate.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from store.schema import CgroupSample, HostSample, NetSample

_IB_WORD_BYTES = 4
_SKIP_NICS = ("lo",)


@dataclass(frozen=True, slots=True)
class _CpuTimes:
    busy: float
    iowait: float
    steal: float
    total: float


class HostReader:
    """Reads one host. Keeps the previous counters to turn them into per-second rates."""

    def __init__(
        self,
        node: str,
        proc_root: Path = Path("/proc"),
        sys_root: Path = Path("/sys"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        ps: Any = psutil,
    ) -> None:
        self._node = node
        self._proc = proc_root
        self._sys = sys_root
        self._cgroup_root = cgroup_root
        self._ps = ps
        self._previous: dict[str, tuple[float, float]] = {}
        self._cpu_prev: _CpuTimes | None = None
        self._pressure = {r: proc_root / "pressure" / r for r in ("cpu", "io", "memory")}

    def sample(self, ts: float) -> tuple[HostSample, list[NetSample]]:
        """One host reading and one row per NIC and InfiniBand port."""
        cpu = self._cpu(self._ps.cpu_times())
        memory = self._ps.virtual_memory()
        disk = self._ps.disk_io_counters(perdisk=False)
        load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        pressure = {r: _read_text(path) or "" for r, path in self._pressure.items()}  # once each
        host = HostSample(
            ts=ts,
            node=self._node,
            cpu_busy_ratio=cpu[0],
            cpu_iowait_ratio=cpu[1],
            cpu_steal_ratio=cpu[2],
            load1=load1,
            cpu_count=self._ps.cpu_count(),
            psi_cpu_some_ratio=parse_psi(pressure["cpu"], "some"),
            psi_io_some_ratio=parse_psi(pressure["io"], "some"),
            psi_io_full_ratio=parse_psi(pressure["io"], "full"),
            psi_memory_some_ratio=parse_psi(pressure["memory"], "some"),
            psi_memory_full_ratio=parse_psi(pressure["memory"], "full"),
            memory_used_bytes=int(memory.total - memory.available),
            memory_available_bytes=int(memory.available),
            disk_read_bytes_per_second=self._rate("disk:r", ts, disk.read_bytes if disk else None),
            disk_write_bytes_per_second=self._rate(
                "disk:w", ts, disk.write_bytes if disk else None
            ),
        )
        return host, self._nics(ts) + self._infiniband(ts)

    def cgroups(self, ts: float, paths: Iterable[str]) -> list[CgroupSample]:
        """CPU cores used by each cgroup in ``paths`` (as read from ``/proc/<pid>/cgroup``)."""
        out = []
        for path in sorted(set(paths)):
            usage = self._cgroup_usage_seconds(path)
            cores = self._rate(f"cg:{path}", ts, usage)
            out.append(
                CgroupSample(
                    ts=ts,
                    node=self._node,
                    cgroup=path,
                    cpu_cores=cores,
                    cpu_limit_cores=self._cgroup_limit(path),
                )
            )
        return out

    # -- CPU -----------------------------------------------------------------------------------

    def _cpu(self, times: Any) -> tuple[float | None, float | None, float | None]:
        iowait = float(getattr(times, "iowait", 0.0))
        steal = float(getattr(times, "steal", 0.0))
        idle = float(times.idle)
        total = float(sum(times))
        # psutil's total double-counts guest time inside user/nice on Linux; subtract it.
        total -= float(getattr(times, "guest", 0.0)) + float(getattr(times, "guest_nice", 0.0))
        current = _CpuTimes(busy=total - idle - iowait, iowait=iowait, steal=steal, total=total)
        previous, self._cpu_prev = self._cpu_prev, current
        if previous is None or current.total <= previous.total:
            return None, None, None
        span = current.total - previous.total

        def ratio(a: float, b: float) -> float:
            return min(max((a - b) / span, 0.0), 1.0)

        return (
            ratio(current.busy, previous.busy),
            ratio(current.iowait, previous.iowait),
            ratio(current.steal, previous.steal),
        )

    # -- counters ------------------------------------------------------------------------------

    def _rate(self, key: str, ts: float, value: float | None) -> float | None:
        if value is None:
            self._previous.pop(key, None)
            return None
        previous = self._previous.get(key)
        self._previous[key] = (ts, float(value))
        if previous is None or ts <= previous[0] or value < previous[1]:
            return None
        return (float(value) - previous[1]) / (ts - previous[0])

    def _nics(self, ts: float) -> list[NetSample]:
        counters = self._ps.net_io_counters(pernic=True) or {}
        return [
            NetSample(
                ts=ts,
                node=self._node,
                kind="nic",
                device=name,
                rx_bytes_per_second=self._rate(f"nic:{name}:rx", ts, c.bytes_recv),
                tx_bytes_per_second=self._rate(f"nic:{name}:tx", ts, c.bytes_sent),
            )
            for name, c in sorted(counters.items())
            if name not in _SKIP_NICS
        ]

    def _infiniband(self, ts: float) -> list[NetSample]:
        base = self._sys / "class" / "infiniband"
        out = []
        for counters in sorted(base.glob("*/ports/*/counters")):
            port = f"{counters.parent.parent.parent.name}/{counters.parent.name}"
            rx = _read_int(counters / "port_rcv_data")
            tx = _read_int(counters / "port_xmit_data")
            out.append(
                NetSample(
                    ts=ts,
                    node=self._node,
                    kind="ib",
                    device=port,
                    rx_bytes_per_second=self._rate(
                        f"ib:{port}:rx", ts, None if rx is None else rx * _IB_WORD_BYTES
                    ),
                    tx_bytes_per_second=self._rate(
                        f"ib:{port}:tx", ts, None if tx is None else tx * _IB_WORD_BYTES
                    ),
                )
            )
        return out

    # -- pressure and cgroups ------------------------------------------------------------------

    def _cgroup_dir(self, path: str) -> Path:
        return self._cgroup_root / path.lstrip("/")

    def _cgroup_usage_seconds(self, path: str) -> float | None:
        stat = _read_text(self._cgroup_dir(path) / "cpu.stat")
        if stat:
            for line in stat.splitlines():
                name, _, value = line.partition(" ")
                if name == "usage_usec" and value.strip().isdigit():
                    return int(value) / 1e6
        v1 = _read_int(self._cgroup_root / "cpuacct" / path.lstrip("/") / "cpuacct.usage")
        return None if v1 is None else v1 / 1e9

    def _cgroup_limit(self, path: str) -> float | None:
        text = _read_text(self._cgroup_dir(path) / "cpu.max")
        if not text:
            return None
        quota, _, period = text.strip().partition(" ")
        if quota == "max" or not quota.isdigit() or not period.isdigit() or int(period) == 0:
            return None
        return int(quota) / int(period)


def parse_psi(text: str, kind: str) -> float | None:
    """Parse a PSI file line like ``some avg10=1.25 avg60=... total=...`` into 0.0125."""
    for line in text.splitlines():
        if line.startswith(kind + " "):
            for part in line.split()[1:]:
                key, _, value = part.partition("=")
                if key == "avg10":
                    try:
                        return float(value) / 100.0
                    except ValueError:
                        return None
    return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def process_cpu_seconds() -> float:
    """CPU seconds (user + system) this process has used."""
    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


def process_rss_bytes() -> int:
    return int(psutil.Process().memory_info().rss)
