"""Scenarios: TOML files that place workloads on virtual nodes over time.

A scenario names its nodes (GPU model and count), its workloads (kind, placement, window and
typed parameters) and optional faults. Built-in scenarios ship in ``sim/scenarios/`` (also
reachable as ``fixtures/scenarios/`` in the repository); any other path to a ``.toml`` works too.
See ``docs/simulation.md`` for the format.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sim.profiles import PROFILES, DeviceProfile, MigProfile, mig_layout
from sim.workloads import REGISTRY, Placement, Window, params_from, workload_class
from store import intent
from store.errors import BadInput

BUILTIN = Path(__file__).parent / "scenarios"
FAULT_KINDS = ("lost", "xid", "driver_gone")


class ScenarioError(BadInput, ValueError):
    """A scenario file is missing or invalid; the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    profile: DeviceProfile
    gpus: int
    cpus: int
    infiniband: bool
    #: MIG layouts: (GPU index, its instances' profiles) for each partitioned GPU.
    mig: tuple[tuple[int, tuple[MigProfile, ...]], ...] = ()

    def layout(self, gpu: int) -> tuple[MigProfile, ...]:
        """The MIG instances of ``gpu`` (``()`` for a whole GPU)."""
        return next((layout for index, layout in self.mig if index == gpu), ())

    def instance_target(self, gpu: int, instance: int) -> int:
        """The placement number of MIG instance ``instance`` of ``gpu``: instances are numbered
        after the node's GPUs, in GPU order (GPU indices stay what they are)."""
        before = sum(len(layout) for index, layout in self.mig if index < gpu)
        return self.gpus + before + instance

    def targets(self) -> list[tuple[int, int, int | None]]:
        """Every place a workload can run: (placement number, GPU index, MIG instance or
        ``None``); a partitioned GPU is not one itself, its instances are."""
        out: list[tuple[int, int, int | None]] = []
        for gpu in range(self.gpus):
            layout = self.layout(gpu)
            if not layout:
                out.append((gpu, gpu, None))
            out += [(self.instance_target(gpu, k), gpu, k) for k in range(len(layout))]
        return sorted(out)


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str
    kind: str
    placements: tuple[Placement, ...]
    window: Window
    params: Any
    #: Who runs it: the user name its uid resolves to (else ``user<uid>``), and for a workload
    #: that runs in a pod (``inference``, or ``training`` as a PyTorchJob's pods), the pod's
    #: namespace.
    user: str | None = None
    namespace: str | None = None
    #: Declared intent (``store.intent``): a Kubernetes owner kind for a workload in a pod
    #: (``Deployment``, ``Notebook``, ...), or a Slurm mode for one in a Slurm job (``slurm
    #: interactive``); its name defaults to the workload's. It may be wrong on purpose: a
    #: training job declared interactive is how the mismatch finding is tested.
    declared: str | None = None
    declared_name: str | None = None


@dataclass(frozen=True, slots=True)
class FaultSpec:
    node: str
    gpu: int | None
    kind: str
    window: Window
    xid: int


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    start_epoch: float
    days: float
    interval_seconds: float
    seed: int
    nodes: tuple[NodeSpec, ...]
    workloads: tuple[WorkloadSpec, ...]
    faults: tuple[FaultSpec, ...]
    #: Relative growth of demand per week (0.08 = +8 % a week, compounding): inference request
    #: rates are scaled by ``(1 + growth) ** (weeks since the start)``.
    growth_per_week: float = 0.0


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN.glob("*.toml"))


def describe_builtins() -> list[tuple[str, str]]:
    return [(name, load(name).description) for name in builtin_names()]


def resolve(name_or_path: str) -> Path:
    """A built-in scenario's file, or the path given. A built-in name wins over a directory of
    the same name in the working directory (``aiscope demo`` run where ``./demo/`` exists)."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.is_file():
        if not path.exists():
            raise ScenarioError(f"{path}: no such scenario file")
        return path
    builtin = BUILTIN / f"{name_or_path}.toml"
    if not builtin.exists():
        raise ScenarioError(
            f"unknown scenario {name_or_path!r}; built-in: {', '.join(builtin_names())} "
            "(or give a path to a .toml file)"
        )
    return builtin


def load(name_or_path: str) -> Scenario:
    """Parse and validate a scenario. Raises :class:`ScenarioError`."""
    path = resolve(name_or_path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not a text file (a scenario .toml expected)") from None
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        return _parse(data, path)
    except (KeyError, TypeError, ValueError) as exc:
        message = exc.args[0] if exc.args else str(exc)
        raise ScenarioError(f"{path}: {message}") from None


def _need(table: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in table:
        raise ValueError(f"{where}: missing {key!r}")
    value = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ValueError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def _parse(data: dict[str, Any], path: Path) -> Scenario:
    start = datetime.fromisoformat(
        str(data.get("start", "2026-11-16T00:00:00+00:00")).replace("Z", "+00:00")
    )
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    nodes = tuple(_node(n, i) for i, n in enumerate(data.get("nodes", [])))
    if not nodes:
        raise ValueError("no [[nodes]]")
    by_name = {n.name: n for n in nodes}
    days = float(data.get("days", 7))
    if not (math.isfinite(days) and 0 < days <= MAX_DAYS):
        raise ValueError(f"days: expected 0 to {MAX_DAYS:g} days, got {days}")
    workloads = tuple(
        _workload(w, i, by_name, days) for i, w in enumerate(data.get("workloads", []))
    )
    names = [w.name for w in workloads]
    if len(set(names)) != len(names):
        raise ValueError("workload names must be unique")
    faults = tuple(_fault(f, i, by_name) for i, f in enumerate(data.get("faults", [])))
    interval = float(data.get("interval_seconds", 60))
    if not (math.isfinite(interval) and interval > 0):
        raise ValueError("interval_seconds must be positive")
    growth = float(data.get("growth_per_week", 0.0))
    if not -1 < growth <= 10:
        raise ValueError(f"growth_per_week: expected a ratio above -1 (0.08 = 8 %), got {growth}")
    return Scenario(
        name=str(data.get("name", path.stem)),
        description=str(data.get("description", "")),
        start_epoch=start.timestamp(),
        days=days,
        interval_seconds=interval,
        seed=int(data.get("seed", 1)),
        nodes=nodes,
        workloads=workloads,
        faults=faults,
        growth_per_week=growth,
    )


#: Bounds a scenario must stay in (a node of NVML's 64 devices; ten years).
MAX_GPUS_PER_NODE = 64
MAX_DAYS = 3660.0


def _node(raw: dict[str, Any], i: int) -> NodeSpec:
    where = f"nodes[{i}]"
    model = _need(raw, "gpu", str, where)
    if model not in PROFILES:
        raise ValueError(f"{where}.gpu: unknown GPU model {model!r}; known: {', '.join(PROFILES)}")
    gpus = int(raw.get("gpus", 8))
    if not 1 <= gpus <= MAX_GPUS_PER_NODE:
        raise ValueError(f"{where}.gpus: expected 1 to {MAX_GPUS_PER_NODE} GPUs, got {gpus}")
    if int(raw.get("cpus", 96)) < 1:
        raise ValueError(f"{where}.cpus: expected at least 1 CPU, got {raw.get('cpus')}")
    return NodeSpec(
        name=_need(raw, "name", str, where),
        profile=PROFILES[model],
        gpus=gpus,
        cpus=int(raw.get("cpus", 96)),
        infiniband=bool(raw.get("infiniband", True)),
        mig=_mig(raw.get("mig", []), model, gpus, where),
    )


def _mig(
    raw: list[dict[str, Any]], model: str, gpus: int, where: str
) -> tuple[tuple[int, tuple[MigProfile, ...]], ...]:
    """``[[nodes.mig]]`` tables: ``gpu = 1`` and ``instances = ["3g.40gb", "1g.10gb", ...]``."""
    out: dict[int, tuple[MigProfile, ...]] = {}
    for k, entry in enumerate(raw):
        gpu = _need(entry, "gpu", int, f"{where}.mig[{k}]")
        names = entry.get("instances")
        if not 0 <= gpu < gpus or gpu in out:
            raise ValueError(f"{where}.mig[{k}].gpu: expected a GPU index of the node, once")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{where}.mig[{k}].instances: expected a list of MIG profile names")
        try:
            out[gpu] = mig_layout(model, names)
        except BadInput as exc:
            raise ValueError(f"{where}.mig[{k}]: {exc}") from None
    return tuple(sorted(out.items()))


def _placements(
    raw: dict[str, Any], where: str, nodes: dict[str, NodeSpec]
) -> tuple[Placement, ...]:
    entries = raw.get("placements") or [
        {"node": raw.get("node"), "gpus": raw.get("gpus", []), "instances": raw.get("instances")}
    ]
    out = []
    for j, entry in enumerate(entries):
        node = entry.get("node")
        if node not in nodes:
            raise ValueError(f"{where}.placements[{j}]: unknown node {node!r}")
        spec = nodes[node]
        gpus = entry.get("gpus", [])
        if gpus == "all":
            gpus = [g for g in range(spec.gpus) if not spec.layout(g)]
        if not isinstance(gpus, list) or any(
            not isinstance(g, int) or not 0 <= g < spec.gpus or spec.layout(g) for g in gpus
        ):
            raise ValueError(
                f"{where}.placements[{j}].gpus: expected GPU indices on {node} that are not "
                'MIG-partitioned (place work on a partitioned GPU with instances = ["GPU/N"])'
            )
        instances = _instances(entry.get("instances") or [], spec, f"{where}.placements[{j}]")
        out.append(Placement(node, tuple(gpus) + instances))
    return tuple(out)


def _instances(raw: list[Any], spec: NodeSpec, where: str) -> tuple[int, ...]:
    """``instances = ["1/0", "1/2"]``: MIG instance 0 and 2 of GPU 1 (in the GPU's layout
    order), as placement numbers (:meth:`NodeSpec.instance_target`)."""
    out = []
    for item in raw:
        gpu, _, k = str(item).partition("/")
        if not (gpu.isdigit() and k.isdigit() and int(k) < len(spec.layout(int(gpu)))):
            raise ValueError(
                f"{where}.instances: {item!r} is not a MIG instance of {spec.name} "
                '(write "GPU/N", N counting the GPU\'s [[nodes.mig]] instances from 0)'
            )
        out.append(spec.instance_target(int(gpu), int(k)))
    return tuple(out)


def _workload(raw: dict[str, Any], i: int, nodes: dict[str, NodeSpec], days: float) -> WorkloadSpec:
    where = f"workloads[{i}]"
    kind = _need(raw, "kind", str, where)
    if kind not in REGISTRY:
        raise ValueError(
            f"{where}.kind: unknown workload kind {kind!r}; known: {', '.join(sorted(REGISTRY))}"
        )
    name = _need(raw, "name", str, where)
    start = float(raw.get("start_hours", 0.0)) * 3600
    end = float(raw.get("end_hours", days * 24)) * 3600
    if end <= start:
        raise ValueError(f"{where}: end_hours must be after start_hours")
    params = params_from(workload_class(kind), raw.get("params", {}), f"{where}.params")
    return WorkloadSpec(
        name,
        kind,
        _placements(raw, where, nodes),
        Window(start, end),
        params,
        user=_identity(raw, "user", where),
        namespace=_identity(raw, "namespace", where),
        declared=_declared(raw, where),
        declared_name=raw.get("declared_name")
        if isinstance(raw.get("declared_name"), str)
        else None,
    )


def _declared(raw: dict[str, Any], where: str) -> str | None:
    """An optional declared kind: a Kubernetes owner kind or a Slurm mode."""
    value = raw.get("declared")
    if value is None:
        return None
    known = (*intent.OWNER_KINDS, *intent.SLURM_KINDS)
    if value not in known:
        raise ValueError(f"{where}.declared: unknown kind {value!r}; known: {', '.join(known)}")
    return str(value)


def _identity(raw: dict[str, Any], key: str, where: str) -> str | None:
    """An optional user or namespace name (a DNS label for a namespace, a login for a user)."""
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,62}", value):
        raise ValueError(f"{where}.{key}: expected a lower-case name like 'alice', got {value!r}")
    return value


def _fault(raw: dict[str, Any], i: int, nodes: dict[str, NodeSpec]) -> FaultSpec:
    where = f"faults[{i}]"
    kind = _need(raw, "kind", str, where)
    if kind not in FAULT_KINDS:
        raise ValueError(f"{where}.kind: expected one of {', '.join(FAULT_KINDS)}")
    node = _need(raw, "node", str, where)
    if node not in nodes:
        raise ValueError(f"{where}.node: unknown node {node!r}")
    start = float(raw.get("at_hours", 0.0)) * 3600
    duration = float(raw.get("duration_hours", 0.0)) * 3600
    gpu = raw.get("gpu")
    return FaultSpec(
        node,
        None if gpu is None else int(gpu),
        kind,
        Window(start, start + duration),
        int(raw.get("xid", 79)),
    )
