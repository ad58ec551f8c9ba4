"""Scenarios: TOML files that place workloads on virtual nodes over time.

A scenario names its nodes (GPU model and count), its workloads (kind, placement, window and
typed parameters) and optional faults. Built-in scenarios ship in ``sim/scenarios/`` (also
reachable as ``fixtures/scenarios/`` in the repository); any other path to a ``.toml`` works too.
See ``docs/simulation.md`` for the format.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.errors import BadInput
from sim.profiles import PROFILES, DeviceProfile
from sim.workloads import REGISTRY, Placement, Window, params_from, workload_class

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


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str
    kind: str
    placements: tuple[Placement, ...]
    window: Window
    params: Any


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
    workloads = tuple(
        _workload(w, i, by_name, days) for i, w in enumerate(data.get("workloads", []))
    )
    names = [w.name for w in workloads]
    if len(set(names)) != len(names):
        raise ValueError("workload names must be unique")
    faults = tuple(_fault(f, i, by_name) for i, f in enumerate(data.get("faults", [])))
    interval = float(data.get("interval_seconds", 60))
    if interval <= 0:
        raise ValueError("interval_seconds must be positive")
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
    )


def _node(raw: dict[str, Any], i: int) -> NodeSpec:
    where = f"nodes[{i}]"
    model = _need(raw, "gpu", str, where)
    if model not in PROFILES:
        raise ValueError(f"{where}.gpu: unknown GPU model {model!r}; known: {', '.join(PROFILES)}")
    return NodeSpec(
        name=_need(raw, "name", str, where),
        profile=PROFILES[model],
        gpus=int(raw.get("gpus", 8)),
        cpus=int(raw.get("cpus", 96)),
        infiniband=bool(raw.get("infiniband", True)),
    )


def _placements(
    raw: dict[str, Any], where: str, nodes: dict[str, NodeSpec]
) -> tuple[Placement, ...]:
    entries = raw.get("placements") or [{"node": raw.get("node"), "gpus": raw.get("gpus", [])}]
    out = []
    for j, entry in enumerate(entries):
        node = entry.get("node")
        if node not in nodes:
            raise ValueError(f"{where}.placements[{j}]: unknown node {node!r}")
        gpus = entry.get("gpus", [])
        if gpus == "all":
            gpus = list(range(nodes[node].gpus))
        if not isinstance(gpus, list) or any(
            not isinstance(g, int) or not 0 <= g < nodes[node].gpus for g in gpus
        ):
            raise ValueError(f"{where}.placements[{j}].gpus: expected GPU indices on {node}")
        out.append(Placement(node, tuple(gpus)))
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
    return WorkloadSpec(name, kind, _placements(raw, where, nodes), Window(start, end), params)


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
