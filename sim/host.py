"""A virtual host: the psutil calls and kernel files the agent's host reader uses.

The agent's :class:`agent.host.HostReader` and :class:`agent.attribution.ProcReader` run unchanged
on it: they get this object in place of the ``psutil`` module, and real directories (a scratch
``proc``, ``sys`` and ``cgroup`` tree) in place of ``/proc``, ``/sys`` and ``/sys/fs/cgroup``.
Counters integrate the workloads' rates over virtual time.
"""

from __future__ import annotations

import shutil
from collections import namedtuple
from dataclasses import dataclass, field
from pathlib import Path

from sim.workloads import HostLoad, ProcessSpec

CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
Memory = namedtuple("Memory", "total available percent used free")
DiskIo = namedtuple("DiskIo", "read_count write_count read_bytes write_bytes read_time write_time")
NetIo = namedtuple(
    "NetIo", "bytes_sent bytes_recv packets_sent packets_recv errin errout dropin dropout"
)
_IB_PORTS = ("mlx5_0", "mlx5_1")


@dataclass(slots=True)
class _Counters:
    user: float = 0.0
    system: float = 0.0
    idle: float = 0.0
    iowait: float = 0.0
    steal: float = 0.0
    disk_read: float = 0.0
    disk_write: float = 0.0
    nic_rx: float = 0.0
    nic_tx: float = 0.0
    ib_rx: float = 0.0
    ib_tx: float = 0.0
    cgroup_usec: dict[str, float] = field(default_factory=dict)


class VirtualHost:
    """One node's host side. ``update`` advances it; the reader then sees the new state."""

    def __init__(
        self,
        node: str,
        root: Path,
        cores: int = 96,
        memory_bytes: int = 2 << 40,
        infiniband: bool = True,
    ) -> None:
        self.node = node
        self.cores = cores
        self.memory_bytes = memory_bytes
        self.proc = root / "proc"
        self.sys = root / "sys"
        self.cgroup = root / "cgroup"
        for d in (self.proc / "pressure", self.sys, self.cgroup):
            d.mkdir(parents=True, exist_ok=True)
        self._c = _Counters()
        self._memory_used = 0.08 * memory_bytes
        self._alive: dict[int, ProcessSpec] = {}
        self._written: dict[Path, str] = {}
        # Every file's path is built once: joining them on each tick was a fifth of the
        # simulated host's cost.
        pressure = self.proc / "pressure"
        self._pressure_files = (pressure / "cpu", pressure / "io", pressure / "memory")
        self._ib_files = tuple(self._ib_counters(hca) for hca in _IB_PORTS) if infiniband else ()
        self._cgroup_files: dict[str, tuple[Path, Path]] = {}
        self.update(0.0, [], {})

    # -- the psutil surface the host reader calls ----------------------------------------------

    def cpu_times(self) -> CpuTimes:
        c = self._c
        return CpuTimes(c.user, 0.0, c.system, c.idle, c.iowait, 0.0, 0.0, c.steal, 0.0, 0.0)

    def virtual_memory(self) -> Memory:
        available = self.memory_bytes - self._memory_used
        used = self._memory_used
        return Memory(
            self.memory_bytes, available, 100.0 * used / self.memory_bytes, used, available
        )

    def disk_io_counters(self, perdisk: bool = False) -> DiskIo:
        c = self._c
        return DiskIo(0, 0, int(c.disk_read), int(c.disk_write), 0, 0)

    def net_io_counters(self, pernic: bool = False) -> dict[str, NetIo]:
        c = self._c
        return {"eth0": NetIo(int(c.nic_tx), int(c.nic_rx), 0, 0, 0, 0, 0, 0)}

    def cpu_count(self) -> int:
        return self.cores

    # -- driving -------------------------------------------------------------------------------

    def update(
        self, dt: float, loads: list[tuple[str, HostLoad]], cgroups: dict[str, float]
    ) -> None:
        """Integrate ``dt`` seconds of the workloads' ``loads`` (cgroup path, load)."""
        c = self._c
        demand = 0.6 + sum(load.cpu_cores for _, load in loads)
        iowait = sum(load.iowait_cores for _, load in loads)
        busy = min(demand, self.cores)
        c.user += busy * 0.85 * dt
        c.system += busy * 0.15 * dt
        c.iowait += min(iowait, self.cores - busy) * dt
        c.idle += max(self.cores - busy - iowait, 0.0) * dt
        c.disk_read += sum(load.disk_read for _, load in loads) * dt
        c.disk_write += sum(load.disk_write for _, load in loads) * dt
        c.nic_rx += sum(load.nic_rx for _, load in loads) * dt
        c.nic_tx += sum(load.nic_tx for _, load in loads) * dt
        c.ib_rx += sum(load.ib_rx for _, load in loads) * dt
        c.ib_tx += sum(load.ib_tx for _, load in loads) * dt
        for path, cores in cgroups.items():
            c.cgroup_usec[path] = c.cgroup_usec.get(path, 0.0) + cores * dt * 1e6
        cpu_pressure = max([0.0] + [load.cpu_pressure for _, load in loads])
        cpu_pressure = max(cpu_pressure, min((demand - self.cores) / self.cores, 1.0))
        io_pressure = max([0.0] + [load.io_pressure for _, load in loads])
        self._write_pressure(cpu_pressure, io_pressure)
        self._write_infiniband()
        self._write_cgroups(loads)

    def _write(self, path: Path, text: str) -> None:
        """Write a kernel-style file, skipping unchanged content (most ticks change little)."""
        if self._written.get(path) == text:
            return
        path.write_text(text)
        self._written[path] = text

    def _write_pressure(self, cpu: float, io: float) -> None:
        def text(some: float, full: float) -> str:
            s, f = f"{some * 100:.2f}", f"{full * 100:.2f}"
            return (
                f"some avg10={s} avg60={s} avg300={s} total=0\n"
                f"full avg10={f} avg60={f} avg300={f} total=0\n"
            )

        cpu_file, io_file, memory_file = self._pressure_files
        self._write(cpu_file, text(cpu, 0.0))
        self._write(io_file, text(io, io * 0.8))
        self._write(memory_file, text(0.0, 0.0))

    def _ib_counters(self, hca: str) -> tuple[Path, Path]:
        """One port's (received, transmitted) counter files, its folder created."""
        counters = self.sys / "class" / "infiniband" / hca / "ports" / "1" / "counters"
        counters.mkdir(parents=True, exist_ok=True)
        return counters / "port_rcv_data", counters / "port_xmit_data"

    def _write_infiniband(self) -> None:
        share = len(_IB_PORTS) * 4  # two ports, and the kernel counts 4-byte words
        for received, transmitted in self._ib_files:
            self._write(received, f"{int(self._c.ib_rx / share)}\n")
            self._write(transmitted, f"{int(self._c.ib_tx / share)}\n")

    def _cgroup(self, path: str) -> tuple[Path, Path]:
        """A cgroup's (cpu.stat, cpu.max) files, its folder created on first use."""
        files = self._cgroup_files.get(path)
        if files is None:
            d = self.cgroup / path.lstrip("/")
            d.mkdir(parents=True, exist_ok=True)
            files = self._cgroup_files[path] = (d / "cpu.stat", d / "cpu.max")
        return files

    def _write_cgroups(self, loads: list[tuple[str, HostLoad]]) -> None:
        limits = {path: load.cpu_limit_cores for path, load in loads}
        for path, usec in self._c.cgroup_usec.items():
            stat, cpu_max = self._cgroup(path)
            self._write(stat, f"usage_usec {int(usec)}\nuser_usec {int(usec * 0.9)}\n")
            limit = limits.get(path)
            self._write(cpu_max, f"{int(limit * 100000)} 100000\n" if limit else "max 100000\n")

    # -- /proc entries ---------------------------------------------------------------------------

    def set_processes(self, alive: dict[int, tuple[ProcessSpec, int]]) -> None:
        """Make exactly ``alive`` (pid -> (spec, start ticks)) visible under ``proc/``."""
        for pid in list(self._alive):
            if pid not in alive:
                shutil.rmtree(self.proc / str(pid), ignore_errors=True)
                del self._alive[pid]
        for pid, (spec, start) in alive.items():
            if pid in self._alive:
                continue
            self._alive[pid] = spec
            d = self.proc / str(pid)
            d.mkdir(exist_ok=True)
            (d / "stat").write_text(
                f"{pid} ({spec.comm}) S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 8 0 "
                f"{start} 0 0\n"
            )
            (d / "comm").write_text(spec.comm + "\n")
            (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in spec.argv) + b"\0")
            (d / "cgroup").write_text(f"0::{spec.cgroup}\n")
            (d / "status").write_text(
                f"Name:\t{spec.comm}\nUid:\t{spec.uid}\t{spec.uid}\t{spec.uid}\t{spec.uid}\n"
            )
