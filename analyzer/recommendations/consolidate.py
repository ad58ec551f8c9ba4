"""``consolidate``: inference and interactive GPUs that use a fraction of a device, packed onto
fewer GPUs or onto MIG slices.

Compute need is the GPU's p95 busy share (SM activity relative to its saturation, else
utilization) with 25% headroom. Memory need is purpose-aware:

* a server that pre-allocates (vLLM's ``--gpu-memory-utilization``, TensorRT-LLM, or memory flat
  at ~0.9 of the device) shows memory that is *not* its need. We use what is known instead: the
  model's size from its name on the command line (``Llama-3.1-8B`` -> 8e9 parameters x 2 bytes)
  plus 20% for KV cache and activations; when nothing is known, no MIG slice is recommended;
* otherwise the observed p99 memory, with 10% headroom.

The smallest MIG profile (``analyzer/data/mig_profiles.toml``, from NVIDIA's MIG user guide)
that covers both is recommended, never smaller than the evidence supports, and the slices are
packed first-fit onto whole GPUs to count the GPUs freed.

GPUs already partitioned start from the layout that exists (:func:`repartition`): each instance
keeps the profile its need calls for (its own when the need is unknown, never a smaller one
than the evidence supports), idle instances are given back, and the GPU is re-partitioned as the
used instances plus the largest free instances that fit (compute slices of 7, memory slices of
8), so idle slices become one instance a larger job can use. When the used instances of several
partitioned GPUs of a model fit on fewer GPUs, the move and the GPUs it frees are named.
"""

from __future__ import annotations

import copy
import functools
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from analyzer.classify import GpuVerdict
from analyzer.load import GpuInfo
from analyzer.recommendations import Inputs, NotEnoughData, Recommendation, quantile, register
from analyzer.recommendations.demand import busy

GB = 1e9
_PARAMS = re.compile(r"[-_/](\d+(?:\.\d+)?)[bB](?:[-_.]|$)")
_PREALLOC = re.compile(r"--gpu-memory-utilization[= ]([0-9.]+)|trtllm|tensorrt_llm|tritonserver")


@dataclass(frozen=True, slots=True)
class ConsolidateSettings:
    max_busy_ratio: float = 0.5  # a GPU busier than this at p95 is not a candidate
    compute_headroom_ratio: float = 0.25
    memory_headroom_ratio: float = 0.10
    min_points: int = 100


@dataclass(frozen=True, slots=True)
class Need:
    gpu: GpuInfo
    busy_p95: float
    memory_gb: float | None  # None: not knowable (pre-allocated, model size unknown)
    why: str
    profile: dict[str, Any] | None


@functools.cache
def _profiles_table() -> dict[str, Any]:
    """The MIG profile table, read once (it was parsed again for every GPU)."""
    return tomllib.loads(resources.files("analyzer").joinpath("data/mig_profiles.toml").read_text())


def profiles_for(model: str | None) -> list[dict[str, Any]]:
    for entry in _profiles_table()["model"]:
        if model and any(m.lower() in model.lower() for m in entry["match"]):
            return copy.deepcopy(list(entry["profiles"]))  # the callers' own to change
    return []


def model_gb_from_command(command: str) -> float | None:
    """Weights in GB from a parameter count in the model's name (bf16: 2 bytes each)."""
    match = _PARAMS.search(command)
    return float(match.group(1)) * 2.0 if match else None


def preallocates(command: str, memory: list[float], total: float | None) -> bool:
    """Whether a server's memory is pre-allocated rather than its need: a pre-allocating
    server on its command line, or memory flat at ~0.9 of the device."""
    device = total or (max(memory) / 0.9 if memory else 0.0)
    flat_at_90 = bool(memory) and device > 0 and abs(quantile(memory, 0.5) / device - 0.9) < 0.03
    return bool(_PREALLOC.search(command)) or flat_at_90


@register
class ConsolidateStrategy:
    kind = "consolidate"

    def __init__(self, settings: ConsolidateSettings | None = None) -> None:
        self.settings = settings or ConsolidateSettings()

    def run(self, inputs: Inputs) -> list[Recommendation] | NotEnoughData:
        repartitions = self._repartitions(inputs)
        needs = [
            n
            for n in (
                self._need(inputs, v.info)
                for v in inputs.verdicts
                if v.gpu_class in ("inference", "interactive") and v.info.parent_uuid is None
            )
            if n is not None and not _whole_device(n)
        ]
        if not needs and repartitions:
            return repartitions
        if not needs:
            return NotEnoughData(
                self.kind,
                "no inference or interactive GPU uses a fraction of a device (or too few points)",
            )
        out = []
        by_model: dict[str, list[Need]] = {}
        for n in needs:
            by_model.setdefault(n.gpu.model or "?", []).append(n)
        for model, group in sorted(by_model.items()):
            rec = self._recommendation(model, group)
            if rec.detail("gpus_freed_count") or rec.detail("unknown_need"):
                out.append(rec)
        out += repartitions
        if not out:
            return NotEnoughData(
                self.kind, "the lightly used GPUs cannot share a device (nothing would be freed)"
            )
        return out

    def _repartitions(self, inputs: Inputs) -> list[Recommendation]:
        """Re-partitioning advice for the MIG-partitioned GPUs, one per GPU model."""
        parents: dict[tuple[str, str], list[GpuVerdict]] = {}
        for v in inputs.verdicts:
            if v.info.parent_uuid is not None:
                parents.setdefault((v.info.node, v.info.parent_uuid), []).append(v)
        by_model: dict[str, list[Slices]] = {}
        for (node, parent), verdicts in sorted(parents.items()):
            table = profiles_for(verdicts[0].info.model)
            if not table:
                continue
            keep = [self._keep(inputs, v, table) for v in verdicts]
            slices = Slices(node, verdicts[0].info.gpu_index, parent, verdicts, keep, table)
            by_model.setdefault(_board(verdicts[0].info.model), []).append(slices)
        return [
            rec for model, group in sorted(by_model.items()) if (rec := repartition(model, group))
        ]

    def _keep(
        self, inputs: Inputs, v: GpuVerdict, table: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """The profile an instance needs (``None``: idle, give it back); its own profile when
        its need is unknown or larger than any smaller profile."""
        current = next((p for p in table if p["name"] == v.info.mig_profile), None)
        if v.gpu_class == "idle":
            return None
        need = self._need(inputs, v.info)
        if need is None or need.profile is None or current is None:
            return current
        # The need's compute is of the instance: as a share of the GPU it is k/7 of that.
        whole = need.busy_p95 * current["slices"] / 7 * (1 + self.settings.compute_headroom_ratio)
        for p in table:
            enough = need.memory_gb is not None and p["memory_gb"] >= need.memory_gb
            if enough and whole <= p["slices"] / 7 and p["slices"] <= current["slices"]:
                return p
        return current

    def _need(self, inputs: Inputs, gpu: GpuInfo) -> Need | None:
        s = self.settings
        buckets = inputs.data.buckets.get(gpu.uuid, ())
        shares = [x for x in busy(buckets) if x is not None]
        if len(shares) < s.min_points:
            return None
        p95 = quantile(shares, 0.95)
        if p95 > s.max_busy_ratio:
            return None
        command = " ".join(
            inputs.data.tenants[tb.tenant].command
            for tb in inputs.data.tenancy.get(gpu.uuid, ())[:1]
            if tb.tenant in inputs.data.tenants
        )
        memory = [b.memory_bytes for b in buckets if b.memory_bytes]
        total = gpu.memory_total_bytes or (max(memory) / 0.9 if memory else 0.0)
        flat_at_90 = bool(memory) and total > 0 and abs(quantile(memory, 0.5) / total - 0.9) < 0.03
        if _PREALLOC.search(command) or flat_at_90:
            weights = model_gb_from_command(command)
            if weights is None:
                need, why = (
                    None,
                    ("memory is pre-allocated (not its need) and the model's size is unknown"),
                )
            else:
                need = weights * 1.2
                why = (
                    f"memory is pre-allocated (not its need); the model's name says "
                    f"~{weights:.0f} GB of weights, +20% for KV cache"
                )
        else:
            need = quantile(memory, 0.99) / GB * (1 + s.memory_headroom_ratio) if memory else 0.0
            why = (
                f"observed p99 memory {quantile(memory, 0.99) / GB:.1f} GB +10%"
                if memory
                else "no memory held"
            )
        profile = None
        if need is not None:
            compute = min(p95 * (1 + s.compute_headroom_ratio), 1.0)
            for p in profiles_for(gpu.model):
                if p["memory_gb"] >= need and p["slices"] / 7 >= compute:
                    profile = p
                    break
        return Need(gpu, p95, need, why, profile)

    def _recommendation(self, model: str, group: list[Need]) -> Recommendation:
        placeable = [n for n in group if n.profile is not None]
        gpus_after = _pack(placeable)
        freed = len(placeable) - gpus_after
        names = [f"{n.gpu.node}/{n.gpu.gpu_index}" for n in placeable]
        profiles = {
            f"{n.gpu.node}/{n.gpu.gpu_index}": n.profile["name"] for n in placeable if n.profile
        }
        unknown = [n for n in group if n.profile is None]
        if placeable:
            summary = (
                f"Pack {len(placeable)} lightly used {model} GPUs onto {gpus_after} with MIG ("
                + ", ".join(sorted({p for p in profiles.values()}))
                + f"), freeing {freed}: {', '.join(names[:6])}"
                + ("..." if len(names) > 6 else "")
            )
        else:
            summary = (
                f"{len(group)} {model} GPUs use a fraction of the device, but their memory "
                "need is unknown; measure it before packing"
            )
        evidence = tuple(
            f"{n.gpu.node}/{n.gpu.gpu_index}: p95 busy {n.busy_p95:.0%}; {n.why}"
            + (f" -> {n.profile['name']}" if n.profile else " -> no slice recommended")
            for n in group
        )
        worst = max((n.busy_p95 for n in placeable), default=0.0)
        return Recommendation(
            kind=self.kind,
            summary=summary,
            evidence=evidence,
            confidence=0.7 if not unknown else 0.5,
            effect=(
                ("gpus_freed", freed),
                ("gpus_needed", 0),
                (
                    "risk",
                    f"bursts above a slice's compute: the busiest candidate's p95 is "
                    f"{worst:.0%} of a GPU; a slice caps latency under load spikes",
                ),
            ),
            details=(
                ("model", model),
                ("gpus_freed_count", freed),
                ("candidates", names),
                ("mig_profiles", profiles),
                ("unknown_need", [f"{n.gpu.node}/{n.gpu.gpu_index}" for n in unknown]),
            ),
        )


def _whole_device(need: Need) -> bool:
    """Whether the need takes every compute slice of the device: such a GPU does not use a
    fraction of it, and packing it frees nothing. (Counted as a candidate, the demo's GPU held
    idle by a kernel, 38.5 GB over a 4g.40gb slice, was "packed" as a 7g.80gb among the
    lightly used GPUs beside its idle-held finding.)"""
    return need.profile is not None and int(need.profile["slices"]) >= 7


@dataclass(frozen=True, slots=True)
class Slices:
    """One partitioned GPU: its instances' verdicts and the profile each needs (``None``:
    idle), against its model's MIG profile table."""

    node: str
    gpu: int
    parent_uuid: str
    verdicts: list[GpuVerdict]
    keep: list[dict[str, Any] | None]
    table: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return f"{self.node} GPU {self.gpu}"


def _board(model: str | None) -> str:
    """The physical GPU's model from a MIG instance's (``... MIG 3g.40gb``)."""
    return re.sub(r"\s+MIG\s+\S+$", "", model or "?")


def layout_text(names: list[str]) -> str:
    """``4×1g.10gb+3g.40gb``: a layout as nvidia-smi users write it, largest profile last."""
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    order = sorted(counts, key=lambda n: (int(n.split("g.")[0]), n))
    return "+".join(n if counts[n] == 1 else f"{counts[n]}×{n}" for n in order) or "(none)"


def _memory_slices(p: dict[str, Any], table: list[dict[str, Any]]) -> int:
    """A profile's memory slices of 8 (the full profile's memory is 8)."""
    return max(1, round(float(p["memory_gb"]) / (float(table[-1]["memory_gb"]) / 8)))


def fill(used: list[dict[str, Any]], table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The free instances to create beside ``used`` on one GPU: the largest profile that fits
    the compute (7) and memory (8) slices left and its per-GPU count, repeatedly."""
    compute = 7 - sum(p["slices"] for p in used)
    memory = 8 - sum(_memory_slices(p, table) for p in used)
    placed = list(used)
    free: list[dict[str, Any]] = []
    while True:
        fits = [
            p
            for p in table
            if p["slices"] <= compute
            and _memory_slices(p, table) <= memory
            and sum(1 for q in placed if q["name"] == p["name"]) < p["per_gpu"]
        ]
        if not fits:
            return free
        best = max(fits, key=lambda p: (p["slices"], p["memory_gb"]))
        free.append(best)
        placed.append(best)
        compute -= best["slices"]
        memory -= _memory_slices(best, table)


def repartition(model: str, group: list[Slices]) -> Recommendation | None:
    """One model's partitioned GPUs: re-partition those with idle instances, and move the used
    instances onto fewer GPUs when they fit. ``None`` when every slice is used."""
    lines: list[str] = []
    layouts: dict[str, dict[str, Any]] = {}
    for g in group:
        current = [v.info.mig_profile or "?" for v in g.verdicts]
        used = [p for p in g.keep if p is not None]
        idle = [i for i, p in enumerate(g.keep) if p is None]
        shrunk = [
            f"{g.verdicts[i].info.mig_profile}->{p['name']}"
            for i, p in enumerate(g.keep)
            if p is not None and p["name"] != g.verdicts[i].info.mig_profile
        ]
        if not idle and not shrunk:
            continue
        proposed = [p["name"] for p in used + fill(used, g.table)]
        layouts[g.name] = {
            "parent_uuid": g.parent_uuid,
            "current": layout_text(current),
            "idle_instances": [f"{i}:{current[i]}" for i in idle],
            "proposed": layout_text(proposed),
        }
        lines.append(_repartition_line(g, idle, current, proposed, shrunk))
    moves, freed = _consolidate_parents(group)
    if not lines and not freed:
        return None
    summary = "; ".join(lines[:3]) + ("; ..." if len(lines) > 3 else "")
    if freed:
        summary = (summary + ". " if summary else "") + moves[0].upper() + moves[1:]
    evidence = tuple(
        f"{v.info.node} GPU {v.info.gpu_index} / {v.info.mig_profile}: {v.gpu_class}"
        + (" -> give back" if keep is None else f" -> {keep['name']}")
        for g in group
        for v, keep in zip(g.verdicts, g.keep, strict=True)
    )
    return Recommendation(
        kind="consolidate",
        summary=summary[0].upper() + summary[1:],
        evidence=evidence,
        confidence=0.7,
        effect=(
            ("gpus_freed", freed),
            ("gpus_needed", 0),
            (
                "risk",
                "re-partitioning a GPU stops every instance on it (nvidia-smi mig -dci/-dgi): "
                "drain the GPU first",
            ),
        ),
        details=(
            ("model", model),
            ("gpus_freed_count", freed),
            ("mig_layouts", layouts),
            ("mig_profiles", {k: v["proposed"] for k, v in layouts.items()}),
        ),
    )


def _repartition_line(
    g: Slices, idle: list[int], current: list[str], proposed: list[str], shrunk: list[str]
) -> str:
    """``slices 2, 3 of gpu-a100-0 GPU 1 idle: re-partition 4×1g.10gb+3g.40gb as ...``."""
    if idle:
        which = ", ".join(str(i) for i in idle)
        head = f"slice{'s' if len(idle) > 1 else ''} {which} of {g.name} idle"
    else:
        head = f"{g.name} has over-sized slices"
    tail = f" ({', '.join(shrunk)})" if shrunk else ""
    return f"{head}: re-partition {layout_text(current)} as {layout_text(proposed)}{tail}"


def _consolidate_parents(group: list[Slices]) -> tuple[str, int]:
    """(sentence, GPUs freed) for moving every used instance of the model's partitioned GPUs
    onto as few GPUs as fit them (first-fit decreasing over compute and memory slices)."""
    if len(group) < 2:
        return "", 0
    table = group[0].table
    used = sorted((p for g in group for p in g.keep if p is not None), key=lambda p: -p["slices"])
    bins: list[list[int]] = []
    for p in used:
        m = _memory_slices(p, table)
        for b in bins:
            if b[0] >= p["slices"] and b[1] >= m:
                b[0] -= p["slices"]
                b[1] -= m
                break
        else:
            bins.append([7 - p["slices"], 8 - m])
    freed = len(group) - len(bins)
    if freed <= 0:
        return "", 0
    busiest = sorted(group, key=lambda g: -sum(1 for p in g.keep if p is not None))
    targets = ", ".join(g.name for g in busiest[: len(bins)]) or "one GPU"
    sources = ", ".join(g.name for g in busiest[len(bins) :])
    return (
        f"the used slices of {len(group)} partitioned GPUs fit on {len(bins)} ({targets}): "
        f"move them there to free {sources}",
        freed,
    )


def _pack(needs: list[Need]) -> int:
    """First-fit-decreasing of slices (7 per GPU) and memory onto whole GPUs."""
    bins: list[list[float]] = []  # [slices left, memory left]
    for n in sorted(needs, key=lambda x: -(x.profile or {}).get("slices", 0)):
        p = n.profile or {}
        full = (profiles_for(n.gpu.model) or [{"memory_gb": 0.0}])[-1]["memory_gb"]
        for b in bins:
            if b[0] >= p["slices"] and b[1] >= p["memory_gb"]:
                b[0] -= p["slices"]
                b[1] -= p["memory_gb"]
                break
        else:
            bins.append([7 - p["slices"], full - p["memory_gb"]])
    return len(bins) if needs else 0
