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
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

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


def profiles_for(model: str | None) -> list[dict[str, Any]]:
    table = tomllib.loads(
        resources.files("analyzer").joinpath("data/mig_profiles.toml").read_text()
    )
    for entry in table["model"]:
        if model and any(m.lower() in model.lower() for m in entry["match"]):
            return list(entry["profiles"])
    return []


def model_gb_from_command(command: str) -> float | None:
    """Weights in GB from a parameter count in the model's name (bf16: 2 bytes each)."""
    match = _PARAMS.search(command)
    return float(match.group(1)) * 2.0 if match else None


@register
class ConsolidateStrategy:
    kind = "consolidate"

    def __init__(self, settings: ConsolidateSettings | None = None) -> None:
        self.settings = settings or ConsolidateSettings()

    def run(self, inputs: Inputs) -> list[Recommendation] | NotEnoughData:
        needs = [
            n
            for n in (
                self._need(inputs, v.info)
                for v in inputs.verdicts
                if v.gpu_class in ("inference", "interactive")
            )
            if n is not None
        ]
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
        if not out:
            return NotEnoughData(
                self.kind, "the lightly used GPUs cannot share a device (nothing would be freed)"
            )
        return out

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
