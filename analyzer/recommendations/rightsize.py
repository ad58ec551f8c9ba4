"""``rightsize``: a workload that uses a fraction of a whole GPU, moved onto the smallest MIG
slice that holds it, with the slowdown it should expect and the layout that would hold it.

For each whole GPU with a MIG profile table (``analyzer/data/mig_profiles.toml``: A100, H100,
H200), over the buckets where its own class held it:

* **memory** is what the memory is for. Training, batch and notebooks: the observed peak plus
  ``memory_headroom_ratio``. A server that pre-allocates (vLLM, TensorRT-LLM, memory flat at
  ~0.9 of the device) shows memory that is not its need: its weights (from the parameter count
  in the model's name) plus ``kv_cache_ratio`` of them for KV cache at the observed peak load;
  unknown weights mean no recommendation (never a guess);
* one workload on one GPU: the ranks of a multi-GPU job cannot move onto slices one by one
  (MIG instances have no peer-to-peer path);
* **speed** is the MIG speed model (:mod:`analyzer.migspeed`, fitted on measured step times):
  the slowdown predicted from the GPU's utilization on the whole device. Throughput work
  (training, batch) is judged at its mean utilization; latency work (serving, notebooks) at its
  p95, the load where a slice would first be felt.

The smallest profile whose memory fits and whose predicted slowdown stays within
``max_slowdown_ratio`` is recommended, with the rest of the GPU filled with the largest
profiles that fit (:func:`analyzer.recommendations.consolidate.fill`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from analyzer import migspeed
from analyzer.classify import GpuVerdict, class_at
from analyzer.load import Bucket
from analyzer.recommendations import Inputs, NotEnoughData, Recommendation, quantile, register
from analyzer.recommendations.consolidate import (
    GB,
    fill,
    layout_text,
    model_gb_from_command,
    preallocates,
    profiles_for,
)

THROUGHPUT_CLASSES = ("training", "batch")
LATENCY_CLASSES = ("inference", "interactive")


@dataclass(frozen=True, slots=True)
class RightsizeSettings:
    max_slowdown_ratio: float = 0.20  # the slowdown a move may cost, stated in the advice
    memory_headroom_ratio: float = 0.10
    kv_cache_ratio: float = 0.20  # KV cache and activations beside a server's weights
    min_points: int = 100
    max_recommendations: int = 10  # the largest savings first


@dataclass(frozen=True, slots=True)
class Fit:
    """One GPU's workload and the slice that holds it."""

    verdict: GpuVerdict
    util_ratio: float
    memory_gb: float
    memory_why: str
    profile: dict[str, Any]
    slowdown_ratio: float
    layout: str


@register
class RightsizeStrategy:
    kind = "rightsize"

    def __init__(self, settings: RightsizeSettings | None = None) -> None:
        self.settings = settings or RightsizeSettings()
        self.model = migspeed.load()

    def run(self, inputs: Inputs) -> list[Recommendation] | NotEnoughData:
        spread = _multi_gpu_tenants(inputs)
        fits = [
            f
            for v in inputs.verdicts
            if v.gpu_class in THROUGHPUT_CLASSES + LATENCY_CLASSES and v.info.parent_uuid is None
            if _main_tenant(inputs, v) not in spread
            if (f := self._fit(inputs, v)) is not None
        ]
        if not fits:
            return NotEnoughData(
                self.kind,
                "no workload on a MIG-capable GPU fits a slice within "
                f"{self.settings.max_slowdown_ratio:.0%} slowdown (or too few points)",
            )
        fits.sort(key=lambda f: (f.profile["slices"], f.slowdown_ratio))
        return [self._recommendation(f) for f in fits[: self.settings.max_recommendations]]

    def _held(self, inputs: Inputs, v: GpuVerdict) -> list[Bucket]:
        return [
            b
            for b in inputs.data.buckets.get(v.info.uuid, ())
            if class_at(v, b.start) == v.gpu_class
        ]

    def _fit(self, inputs: Inputs, v: GpuVerdict) -> Fit | None:
        table = profiles_for(v.info.model)
        held = self._held(inputs, v)
        utils = [b.util for b in held if b.util is not None]
        if not table or len(utils) < self.settings.min_points:
            return None
        util = (
            statistics.fmean(utils) if v.gpu_class in THROUGHPUT_CLASSES else quantile(utils, 0.95)
        )
        memory = self._memory_gb(inputs, v, held)
        if memory is None:
            return None
        need, why = memory
        full_gb = float(table[-1]["memory_gb"])
        for p in table[:-1]:
            if p["memory_gb"] < need:
                continue
            loss = self.model.slowdown(
                util, p["slices"] / migspeed.COMPUTE_SLICES, _bandwidth_share(p, full_gb)
            )
            if loss <= self.settings.max_slowdown_ratio:
                layout = layout_text([q["name"] for q in [p, *fill([p], table)]])
                return Fit(v, util, need, why, p, loss, layout)
        return None

    def _memory_gb(
        self, inputs: Inputs, v: GpuVerdict, held: list[Bucket]
    ) -> tuple[float, str] | None:
        """(memory need in GB, why); ``None`` when it cannot be known."""
        s = self.settings
        peaks = [b.memory_max_bytes or b.memory_bytes for b in held]
        observed = [m for m in peaks if m]
        command = _command(inputs, v)
        means = [b.memory_bytes for b in held if b.memory_bytes]
        if v.gpu_class == "inference" and preallocates(command, means, v.info.memory_total_bytes):
            weights = model_gb_from_command(command)
            if weights is None:
                return None
            return (
                weights * (1 + s.kv_cache_ratio),
                f"pre-allocated memory is not its need: ~{weights:.0f} GB of weights (from the "
                f"model's name) + {s.kv_cache_ratio:.0%} KV cache at peak",
            )
        if not observed:
            return None
        peak = max(observed) / GB
        return (
            peak * (1 + s.memory_headroom_ratio),
            f"observed peak memory {peak:.1f} GB + {s.memory_headroom_ratio:.0%} headroom",
        )

    def _recommendation(self, f: Fit) -> Recommendation:
        s = self.settings
        info = f.verdict.info
        name = f"{info.node}/{info.gpu_index}"
        how = "mean" if f.verdict.gpu_class in THROUGHPUT_CLASSES else "p95"
        slices_freed = migspeed.COMPUTE_SLICES - int(f.profile["slices"])
        summary = (
            f"Right-size the {f.verdict.gpu_class} work on {name} ({info.model}) onto a "
            f"{f.profile['name']} MIG slice: expected {f.slowdown_ratio:.0%} slower (within "
            f"{s.max_slowdown_ratio:.0%}), in a {f.layout} layout that leaves "
            f"{slices_freed} of 7 compute slices to others."
        )
        evidence = (
            f"{name}: {how} utilization {f.util_ratio:.0%} of the whole GPU over its "
            f"{f.verdict.gpu_class} intervals",
            f"memory need {f.memory_gb:.1f} GB: {f.memory_why}; {f.profile['name']} has "
            f"{f.profile['memory_gb']:g} GB",
            f"slowdown from the MIG speed model ({self.model.source}): median error 8 points "
            "on held-back models and batch sizes (bench/mig_sizing.py)",
        )
        return Recommendation(
            kind=self.kind,
            summary=summary,
            evidence=evidence,
            confidence=0.6,
            effect=(
                ("gpus_freed", round(slices_freed / migspeed.COMPUTE_SLICES, 2)),
                ("gpus_needed", 0),
                ("slowdown_ratio", f.slowdown_ratio),
                (
                    "risk",
                    f"the work runs ~{f.slowdown_ratio:.0%} slower; load above the observed "
                    f"{how} would be capped by the slice",
                ),
            ),
            details=(
                ("gpu", name),
                ("uuid", info.uuid),
                ("model", info.model),
                ("class", f.verdict.gpu_class),
                ("mig_profile", f.profile["name"]),
                ("layout", f.layout),
                ("util_ratio", f.util_ratio),
                ("memory_need_gb", f.memory_gb),
                ("expected_slowdown_ratio", f.slowdown_ratio),
                ("max_slowdown_ratio", s.max_slowdown_ratio),
            ),
        )


def _bandwidth_share(profile: dict[str, Any], full_gb: float) -> float:
    """A profile's share of memory bandwidth: its memory slices of 8."""
    eighths = max(1, round(float(profile["memory_gb"]) / (full_gb / migspeed.MEMORY_SLICES)))
    return eighths / migspeed.MEMORY_SLICES


def _multi_gpu_tenants(inputs: Inputs) -> set[str]:
    """Workloads on more than one GPU (data- or tensor-parallel ranks): MIG instances have no
    peer-to-peer path between them (PCIe or NVLink; NVIDIA's MIG user guide), so their ranks
    cannot move onto slices one by one."""
    gpus: dict[str, set[str]] = {}
    for uuid, tbs in inputs.data.tenancy.items():
        for name in tbs.first_seen():
            gpus.setdefault(name, set()).add(uuid)
    return {t for t, held in gpus.items() if len(held) > 1}


def _main_tenant(inputs: Inputs, v: GpuVerdict) -> str | None:
    return inputs.main_tenant(v.info.uuid)


def _command(inputs: Inputs, v: GpuVerdict) -> str:
    return " ".join(
        inputs.data.tenants[tb.tenant].command
        for tb in inputs.data.tenancy.get(v.info.uuid, ())[:1]
        if tb.tenant in inputs.data.tenants
    )
