"""``placement``: a multi-node job that waits on communication or the network, packed onto fewer
servers (one server is one NVLink domain on an HGX board) where the fleet has room, with the
GPU-hours that packing is expected to recover.

The prediction rests on the job's measured waiting (:mod:`analyzer.starved`: the GPU-hours its
GPUs spent waiting in collectives, ``communication``, or while InfiniBand surged, ``network``).
Packing removes the scale-out part of that waiting: a share ``recovered_ratio`` of it, fitted on
measured consolidated-against-spread throughputs of 158 multi-GPU training jobs (Gavel, OSDI'20;
``bench/placement.py`` fits it on some job types and scores it on the others). A job spread with
waiting share ``w`` runs ``1 - recovered_ratio * w`` as long once packed, so the GPU-hours
recovered are ``recovered_ratio`` x its scale-out waiting GPU-hours.

Room: a node can take the job's GPUs that it already holds plus its GPUs that idled while the job
ran (``room_idle_ratio`` of the job's intervals). The job is packed greedily onto the nodes with
the most room; when that takes fewer nodes than it spans now, the move is recommended.
"""

from __future__ import annotations

import statistics
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from analyzer.classify import class_at
from analyzer.context import Finding, Floats
from analyzer.recommendations import Inputs, NotEnoughData, Recommendation, register

SCALE_OUT_CAUSES = ("communication", "network")


@dataclass(frozen=True, slots=True)
class RecoveryModel:
    """The share of a spread job's waiting that packing recovers, and where it was fitted."""

    recovered_ratio: float
    source: str


def load_model() -> RecoveryModel:
    """The shipped parameter (``analyzer/data/placement.toml``); needs no trace."""
    text = resources.files("analyzer").joinpath("data/placement.toml").read_text()
    table = tomllib.loads(text)
    return RecoveryModel(float(table["recovered_ratio"]), str(table["source"]))


def fit_recovered_ratio(waiting: Sequence[float], loss: Sequence[float]) -> float:
    """The share (0..1.5 by 0.01) whose ``share * waiting`` has the least median absolute
    error against the measured loss of spreading (``1 - spread / consolidated``)."""
    pairs = list(zip(waiting, loss, strict=True))
    if not pairs:
        raise ValueError("no jobs to fit")
    return min(
        (i / 100 for i in range(151)),
        key=lambda r: (statistics.median(abs(r * w - x) for w, x in pairs), r),
    )


@dataclass(frozen=True, slots=True)
class PlacementSettings:
    min_scale_out_gpu_hours: float = 1.0
    #: A GPU is room for the job when it idled this share of the job's intervals.
    room_idle_ratio: float = 0.9


@dataclass(frozen=True, slots=True)
class _Job:
    name: str
    gpus_by_node: dict[str, int]
    scale_out_gpu_hours: float
    waiting_gpu_hours: float
    held_gpu_hours: float
    uuids: frozenset[str]
    starts: frozenset[float]


@register
class PlacementStrategy:
    kind = "placement"

    def __init__(self, settings: PlacementSettings | None = None) -> None:
        self.settings = settings or PlacementSettings()
        self.model = load_model()

    def run(self, inputs: Inputs) -> list[Recommendation] | NotEnoughData:
        jobs = [j for j in _jobs(inputs) if len(j.gpus_by_node) > 1]
        jobs = [j for j in jobs if j.scale_out_gpu_hours >= self.settings.min_scale_out_gpu_hours]
        if not jobs:
            return NotEnoughData(
                self.kind, "no multi-node job waits on communication or the network"
            )
        out = [
            r
            for j in jobs
            if (r := self._recommendation(j, room_for(inputs, j, self.settings.room_idle_ratio)))
            is not None
        ]
        if not out:
            return NotEnoughData(
                self.kind,
                "the multi-node jobs that wait on the network already span the fewest nodes "
                "the fleet has room for",
            )
        return out

    def _recommendation(self, job: _Job, room: Mapping[str, int]) -> Recommendation | None:
        target = pack(job.gpus_by_node, room)
        if target is None or len(target) >= len(job.gpus_by_node):
            return None
        # The text's figures from the document's (to_json rounds to 3 places): formatting the
        # unrounded value put 18.5496 in the text as 18.5 beside a field of 18.55 (read as 18.6).
        scale_out = round(job.scale_out_gpu_hours, 3)
        recovered = round(self.model.recovered_ratio * job.scale_out_gpu_hours, 3)
        gpus = sum(job.gpus_by_node.values())
        where = (
            f"one server ({target[0]}, one NVLink domain)"
            if len(target) == 1
            else f"{len(target)} servers ({', '.join(target)})"
        )
        spread = ", ".join(f"{n} ({g})" for n, g in sorted(job.gpus_by_node.items()))
        share = job.scale_out_gpu_hours / job.held_gpu_hours if job.held_gpu_hours else 0.0
        return Recommendation(
            kind=self.kind,
            summary=(
                f"Pack {job.name} ({gpus} GPUs on {len(job.gpus_by_node)} servers) onto {where}: "
                f"it waited {scale_out:.1f} GPU-hours on communication and the "
                f"network, and packing is expected to recover {recovered:.1f} GPU-hours a "
                "window like this one."
            ),
            evidence=(
                f"{job.name} runs on {spread}",
                f"measured waiting: {job.waiting_gpu_hours:.1f} GPU-h, of which "
                f"{scale_out:.1f} on communication or the network "
                f"({share:.0%} of its {job.held_gpu_hours:.0f} held GPU-h)",
                f"packing recovers {self.model.recovered_ratio:.0%} of scale-out waiting "
                f"({self.model.source}; bench/placement.py)",
                f"room: {', '.join(f'{n} {room.get(n, 0)} GPUs' for n in target)} "
                "(the job's own GPUs plus GPUs idle while it ran)",
            ),
            confidence=0.6,
            effect=(
                ("gpus_freed", 0),
                ("gpus_needed", 0),
                ("gpu_hours_recovered", recovered),
                (
                    "risk",
                    "moving a job means a restart from its last checkpoint; a straggler's "
                    "waiting is not placement and stays",
                ),
            ),
            details=(
                ("job", job.name),
                ("nodes", sorted(job.gpus_by_node)),
                ("target_nodes", target),
                ("scale_out_waiting_gpu_hours", scale_out),
                ("expected_recovery_gpu_hours", recovered),
            ),
        )


def pack(gpus_by_node: Mapping[str, int], room: Mapping[str, int]) -> list[str] | None:
    """The fewest nodes, most room first, whose room holds the job's GPUs; ``None`` if the
    fleet has no room for it."""
    need = sum(gpus_by_node.values())
    chosen: list[str] = []
    for node in sorted(room, key=lambda n: (-room[n], -gpus_by_node.get(n, 0), n)):
        if need <= 0:
            break
        if room[node] > 0:
            chosen.append(node)
            need -= room[node]
    return sorted(chosen) if need <= 0 else None


def room_for(inputs: Inputs, job: _Job, idle_ratio: float) -> dict[str, int]:
    """GPUs per node a packed job could use while it ran: its own, and whole GPUs that were
    idle in at least ``idle_ratio`` of the intervals it held its GPUs."""
    when = sorted(job.starts)
    room: dict[str, int] = {}
    for v in inputs.verdicts:
        if v.info.parent_uuid is not None:
            continue
        room.setdefault(v.info.node, 0)
        idle = sum(class_at(v, t) == "idle" for t in when)
        if v.info.uuid in job.uuids or (when and idle >= idle_ratio * len(when)):
            room[v.info.node] += 1
    return room


def _held_at(inputs: Inputs, names: set[str]) -> dict[str, dict[str, Floats]]:
    """For each of the jobs ``names``, the starts of the buckets it held on each GPU (GPUs in
    the tenancy's order): one walk over the tenancy for all jobs, not one per job. Arrays, not
    lists of floats (a float in a list took 32 bytes, here 8, for every bucket of every starved
    job's GPU)."""
    out: dict[str, dict[str, Floats]] = {}
    for uuid, tbs in inputs.data.tenancy.items():
        present = tbs.first_seen()  # as first met, as one walk would meet them
        if names.isdisjoint(present):  # most GPUs: none of the jobs
            continue
        code = {name: i for i, name in enumerate(tbs.names)}
        for name in present:
            if name in names:
                out.setdefault(name, {})[uuid] = tbs.starts[tbs.codes == code[name]]
    return out


def _jobs(inputs: Inputs) -> list[_Job]:
    by_job: dict[str, list[Finding]] = {}
    for f in inputs.findings:
        if f.kind == "starved" and f.detail("job"):
            by_job.setdefault(str(f.detail("job")), []).append(f)
    hours = inputs.data.bucket_seconds / 3600.0
    nodes = {g.uuid: g.node for g in inputs.data.gpus}
    held_at = _held_at(inputs, set(by_job))
    out = []
    for name, findings in sorted(by_job.items()):
        gpus: dict[str, set[str]] = {}
        starts: set[float] = set()
        held = 0.0
        for uuid, mine in held_at.get(name, {}).items():
            node = nodes.get(uuid)
            if node is not None:
                gpus.setdefault(node, set()).add(uuid)
                starts.update(mine.tolist())
                held += len(mine) * hours
        for f in findings:
            gpus.setdefault(f.node, set()).add(f.uuid)
        scale_out = sum(_scale_out_hours(f.detail("causes") or {}) for f in findings)
        waiting = sum(f.gpu_hours_lost for f in findings)
        counts = {n: len(u) for n, u in gpus.items()}
        uuids = frozenset(u for us in gpus.values() for u in us)
        out.append(_Job(name, counts, scale_out, waiting, held, uuids, frozenset(starts)))
    return out


def _scale_out_hours(causes: Mapping[str, Any]) -> float:
    return float(sum(float(causes.get(c, 0.0)) for c in SCALE_OUT_CAUSES))


def scale_out_waiting(findings: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The fleet's waiting and its scale-out share, from the analysis document's findings:
    waiting on communication or the network by jobs that span more than one node, over all
    starved GPU-hours."""
    starved = [f for f in findings if f.get("kind") == "starved"]
    nodes: dict[str, set[str]] = {}
    for f in starved:
        nodes.setdefault(str(f.get("job")), set()).add(str(f.get("node")))
    total = sum(float(f.get("gpu_hours_lost") or 0.0) for f in starved)
    scale_out = sum(
        _scale_out_hours(f.get("causes") or {})
        for f in starved
        if len(nodes[str(f.get("job"))]) > 1
    )
    return {
        "starved_gpu_hours": round(total, 2),
        "scale_out_gpu_hours": round(scale_out, 2),
        "scale_out_ratio": round(scale_out / total, 3) if total > 0 else None,
        "multi_node_jobs": sorted(j for j, n in nodes.items() if len(n) > 1),
    }
