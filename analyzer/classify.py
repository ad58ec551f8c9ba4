"""What each GPU was doing: segment its timeline, describe each segment, classify it.

Signals, each used when present and skipped when not (real captures often have only utilization
and memory):

* utilization level and distribution (a duty cycle, not efficiency), and how often the GPU shows
  any activity at all (requests keep a server blipping; a notebook sits at zero for hours);
* the memory plateau (flat for training and pre-allocating servers, load-following for a growing
  KV cache) and its level relative to the device;
* power relative to the limit, or to the GPU's own observed maximum when the limit is unknown:
  ranks waiting in a collective read ~100% utilization at low power;
* cross-GPU structure: GPUs that start together and move together are one job;
* daily cycles (online serving follows its users), daily recurrence of bounded windows (batch);
* process metadata (``torchrun``, ``vllm``, ``tritonserver``, ``jupyter``, ...) as a hint with its
  own weight, never the only basis.

Thresholds were tuned on the ``demo`` and focused scenarios and are checked on held-out scenarios
with other seeds and parameters in ``bench/classify.py``.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from agent.schema import GpuClass
from analyzer.load import Bucket, FleetData, GpuInfo

CLASSES = tuple(GpuClass)
OCCUPIED_MEMORY_RATIO = 0.02
ACTIVE_UTIL = 0.05
MEMORY_JUMP_RATIO = 0.25
MIN_SEGMENT_BUCKETS = 3
HELD_FLOOR_RATIO = 0.01

HINTS: dict[str, tuple[str, ...]] = {
    "training": (
        "torchrun",
        "torch.distributed",
        "deepspeed",
        "accelerate launch",
        "train.py",
        "finetune",
        "megatron",
        "lightning",
        "horovod",
    ),
    "inference": (
        "vllm",
        "tritonserver",
        "sglang",
        "text-generation-launcher",
        "tgi",
        "trtllm",
        "api_server",
        "serve",
        "ollama",
        "llama-server",
    ),
    "batch": ("batch", "score", "offline", "embed_corpus", "nightly"),
    "interactive": ("jupyter", "ipykernel", "notebook", "code-server", "rstudio"),
}


@dataclass(frozen=True, slots=True)
class Segment:
    start: float
    end: float
    gpu_class: str
    confidence: float
    evidence: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    info: GpuInfo
    gpu_class: str
    confidence: float
    evidence: tuple[str, ...]
    segments: tuple[Segment, ...]


def class_at(verdict: GpuVerdict, t: float) -> str:
    """The class of the verdict's segment that holds ``t``; ``idle`` outside every segment."""
    return next((s.gpu_class for s in verdict.segments if s.start <= t < s.end), "idle")


@dataclass(slots=True)
class _Span:
    """A run of buckets with one behaviour, and the features the classifier reads."""

    gpu: GpuInfo
    buckets: list[Bucket]
    occupied: bool
    features: dict[str, float] = field(default_factory=dict)
    peers: int = 0
    peer_r: float = 0.0

    @property
    def start(self) -> float:
        return self.buckets[0].start

    @property
    def end(self) -> float:
        return self.buckets[-1].start


def classify(data: FleetData) -> list[GpuVerdict]:
    """A verdict per GPU: its overall class, confidence, evidence and segments."""
    spans: dict[str, list[_Span]] = {}
    for gpu in data.gpus:
        buckets = list(data.buckets.get(gpu.uuid, ()))
        spans[gpu.uuid] = _segment(gpu, buckets, _memory_reference(gpu, buckets))
    all_spans = [s for group in spans.values() for s in group]
    for span in all_spans:
        span.features = _features(span, data.bucket_seconds)
    _cross_gpu(all_spans)
    _recurrence(spans)
    verdicts = []
    for gpu in data.gpus:
        segments = [
            _classify_span(s, data.hints.get(gpu.uuid, ()), data.bucket_seconds)
            for s in spans[gpu.uuid]
        ]
        verdicts.append(_overall(gpu, segments))
    return verdicts


# -- segmentation ---------------------------------------------------------------------------------


def _memory_reference(gpu: GpuInfo, buckets: list[Bucket]) -> float:
    if gpu.memory_total_bytes:
        return float(gpu.memory_total_bytes)
    observed = [b.memory_max_bytes for b in buckets if b.memory_max_bytes]
    return max(observed) / 0.9 if observed else 1.0


def _occupied(b: Bucket, total: float) -> bool:
    memory = (b.memory_bytes or 0.0) / total
    return memory > OCCUPIED_MEMORY_RATIO or (b.util_max or 0.0) > ACTIVE_UTIL


def _segment(gpu: GpuInfo, buckets: list[Bucket], total: float) -> list[_Span]:
    """Split where the GPU becomes held or free, or its memory jumps to a new plateau."""
    spans: list[_Span] = []
    for i, b in enumerate(buckets):
        occupied = _occupied(b, total)
        jump = False
        if spans and occupied and spans[-1].occupied and i + 2 < len(buckets):
            prev = (buckets[i - 1].memory_bytes or 0.0) / total
            now = (b.memory_bytes or 0.0) / total
            after = [(buckets[j].memory_bytes or 0.0) / total for j in (i + 1, i + 2)]
            jump = abs(now - prev) > MEMORY_JUMP_RATIO and all(abs(a - now) < 0.1 for a in after)
        if not spans or spans[-1].occupied != occupied or jump:
            spans.append(_Span(gpu, [b], occupied))
        else:
            spans[-1].buckets.append(b)
    merged: list[_Span] = []
    for span in spans:  # short blips belong to their neighbour
        if merged and len(span.buckets) < MIN_SEGMENT_BUCKETS:
            merged[-1].buckets.extend(span.buckets)
        else:
            merged.append(span)
    return merged


# -- features -------------------------------------------------------------------------------------


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _features(span: _Span, bucket_seconds: int) -> dict[str, float]:
    b = span.buckets
    util = [x.util for x in b if x.util is not None]
    total = _memory_reference(span.gpu, b)
    memory = [(x.memory_bytes or 0.0) / total for x in b]
    f: dict[str, float] = {"hours": len(b) * bucket_seconds / 3600.0}
    if util:
        f |= {
            "util_median": statistics.median(util),
            "util_mean": statistics.fmean(util),
            "util_p10": _q(util, 0.1),
            "util_p90": _q(util, 0.9),
            "util_std": statistics.pstdev(util),
            "active": sum(1 for x in b if (x.util_max or 0.0) > ACTIVE_UTIL) / len(b),
            "busy": sum(1 for u in util if u > 0.6) / len(util),
        }
    f["memory_median"] = statistics.median(memory)
    f["memory_cv"] = statistics.pstdev(memory) / max(statistics.fmean(memory), 1e-9)
    if util and len(util) == len(memory) and len(util) > 10:
        f["memory_util_r"] = _pearson(util, memory)
    power = [x.power_watts for x in b if x.power_watts is not None]
    limit = span.gpu.power_limit_watts or (max(power) if power else None)
    if power and limit:
        ratios = [p / limit for p in power]
        f["power_median"] = statistics.median(ratios)
        f["power_of_limit"] = 1.0 if span.gpu.power_limit_watts else 0.0
        # Busy at low power: buckets where kernels "run" but the GPU draws little (collectives).
        pairs = [
            (x.util, x.power_watts / limit)
            for x in b
            if x.util is not None and x.power_watts is not None
        ]
        high = [p for u, p in pairs if u >= 0.85]
        if high:
            med = statistics.median(high)
            f["busy_low_power"] = sum(1 for p in high if p < 0.7 * med) / len(high)
    sm = [x.sm_active for x in b if x.sm_active is not None]
    if sm and util:
        f["sm_mean"] = statistics.fmean(sm)
    nvlink = [x.nvlink_bytes_per_second for x in b if x.nvlink_bytes_per_second is not None]
    if nvlink:
        f["nvlink_gbps"] = statistics.fmean(nvlink) / 1e9
    if util and f["hours"] >= 30:
        f["diurnal"] = _diurnal(b)
    cycle_found = cycle(b, bucket_seconds)
    if cycle_found is not None:
        f["cycle_minutes"], f["cycle_r"] = cycle_found
    f["night"] = sum(1 for x in b if _hour(x.start) >= 20.0 or _hour(x.start) < 8.0) / len(b)
    return f


def cycle(buckets: list[Bucket], bucket_seconds: int) -> tuple[float, float] | None:
    """The period of a repeating dip (checkpoints, evaluation) between 10 minutes and 3 hours:
    the lag with the strongest autocorrelation of power (utilization when power is missing),
    if it is a clear peak. Returns (minutes, r)."""
    values = [x.power_watts if x.power_watts is not None else x.util for x in buckets]
    series = [v for v in values if v is not None]
    if len(series) != len(values) or len(series) < 36:
        return None
    lo = max(2, int(600 / bucket_seconds))
    hi = min(len(series) // 3, int(10800 / bucket_seconds))
    if hi <= lo + 1:
        return None
    mean = statistics.fmean(series)
    centred = [v - mean for v in series]
    energy = sum(v * v for v in centred)
    if energy <= 1e-9:
        return None
    r = {
        k: sum(a * b for a, b in zip(centred, centred[k:], strict=False)) / energy
        for k in range(lo, hi + 1)
    }
    peaks = [
        k for k in r if r[k] >= 0.25 and r[k] >= r.get(k - 1, -1.0) and r[k] >= r.get(k + 1, -1.0)
    ]
    if not peaks:
        return None
    strongest = max(r[k] for k in peaks)
    # The fundamental: multiples of a 45-minute checkpoint cycle peak too, and so does the
    # least common multiple with an evaluation cycle; the shortest strong peak is the cycle.
    best = min(k for k in peaks if r[k] >= 0.8 * strongest)
    return best * bucket_seconds / 60.0, r[best]


def _diurnal(buckets: list[Bucket]) -> float:
    """How much of the utilization's variance an hour-of-day profile explains (0..1)."""
    by_hour: dict[int, list[float]] = {}
    for x in buckets:
        if x.util is not None:
            by_hour.setdefault(int((x.start % 86400) // 3600), []).append(x.util)
    if len(by_hour) < 20:
        return 0.0
    means = {h: statistics.fmean(v) for h, v in by_hour.items()}
    fitted = [means[int((x.start % 86400) // 3600)] for x in buckets if x.util is not None]
    actual = [x.util for x in buckets if x.util is not None]
    r = _pearson(actual, fitted)
    return max(r, 0.0) ** 2


def _pearson(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 3:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    vx = sum((x - mx) ** 2 for x in xs)
    vy = sum((y - my) ** 2 for y in ys)
    if vx <= 1e-12 or vy <= 1e-12:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / math.sqrt(vx * vy)


def _cross_gpu(spans: list[_Span]) -> None:
    """GPUs whose held spans start together and share a footprint move as one job; count them
    and measure how closely they move (power, else utilization)."""
    held = [s for s in spans if s.occupied and len(s.buckets) >= 24]
    for s in held:
        series = _series(s)
        peers = []
        for o in held:
            if o is s or abs(o.start - s.start) > 1200 or abs(o.end - s.end) > 3600:
                continue
            if abs(o.features["memory_median"] - s.features["memory_median"]) > 0.1:
                continue
            peers.append(_aligned_r(series, _series(o)))
        s.peers = sum(1 for r in peers if r >= 0.5)
        s.peer_r = max(peers, default=0.0)


def _series(span: _Span) -> dict[float, float]:
    use_power = all(x.power_watts is not None for x in span.buckets[:5])
    return {x.start: (x.power_watts if use_power else x.util) or 0.0 for x in span.buckets}


def _aligned_r(a: dict[float, float], b: dict[float, float]) -> float:
    keys = sorted(set(a) & set(b))
    if len(keys) < 12:
        return 0.0
    return _pearson([a[k] for k in keys], [b[k] for k in keys])


def _recurrence(spans: dict[str, list[_Span]]) -> None:
    """Held spans that recur at about the same hour on other days (batch windows). A span cut
    by the window's edge is compared by its intact end, without its length."""
    for group in spans.values():
        if not group:
            continue
        first, last = group[0].start, group[-1].end
        held = [s for s in group if s.occupied]
        for s in held:
            s.features["recurring"] = float(
                sum(1 for o in held if o is not s and _same_window(s, o, first, last))
            )


def _hour(ts: float) -> float:
    return (ts % 86400) / 3600.0


def _close(a: float, b: float, hours: float = 1.0) -> bool:
    d = abs(a - b)
    return min(d, 24 - d) <= hours


def _same_window(s: _Span, o: _Span, first: float, last: float) -> bool:
    cut = s.start <= first or s.end >= last or o.start <= first or o.end >= last
    if cut:
        return (s.start > first and o.start > first and _close(_hour(s.start), _hour(o.start))) or (
            s.end < last and o.end < last and _close(_hour(s.end), _hour(o.end))
        )
    same_length = abs(o.features["hours"] - s.features["hours"]) <= 0.35 * s.features["hours"]
    return same_length and _close(_hour(s.start), _hour(o.start))


# -- the decision ---------------------------------------------------------------------------------


def _hinted(hints: tuple[str, ...]) -> str | None:
    text = " ".join(hints).lower()
    votes = Counter(cls for cls, words in HINTS.items() for w in words if w in text)
    return votes.most_common(1)[0][0] if votes else None


def _classify_span(span: _Span, hints: tuple[str, ...], bucket_seconds: int) -> Segment:
    end = span.end + bucket_seconds
    f = span.features
    if not span.occupied:
        return Segment(span.start, end, "idle", 0.95, ("no memory held and no kernels ran",))
    scores, evidence = _scores(span)
    hint = _hinted(hints)
    if hint:
        scores[hint] += 0.35
    best = max(scores, key=lambda k: scores[k])
    ranked = sorted(scores.values(), reverse=True)
    margin = ranked[0] - (ranked[1] if len(ranked) > 1 else 0.0)
    confidence = round(min(0.55 + margin * 0.5, 0.98), 2)
    words = [*evidence.get(best, []), _describe(f)]
    if hint:
        words.append(f"process metadata suggests {hint} ({_hint_word(hints, hint)})")
    return Segment(span.start, end, best, confidence, tuple(w for w in words if w))


def _hint_word(hints: tuple[str, ...], cls: str) -> str:
    text = " ".join(hints).lower()
    return next((w for w in HINTS[cls] if w in text), cls)


def _describe(f: dict[str, float]) -> str:
    parts = [f"{f['hours']:.1f} h held", f"memory {f['memory_median']:.0%} of the device"]
    if "util_median" in f:
        parts.append(f"utilization median {f['util_median']:.0%} (p90 {f['util_p90']:.0%})")
    if "power_median" in f:
        of = "limit" if f.get("power_of_limit") else "its observed maximum"
        parts.append(f"power {f['power_median']:.0%} of {of}")
    return ", ".join(parts)


def _scores(span: _Span) -> tuple[dict[str, float], dict[str, list[str]]]:
    """Points per class from each signal; the evidence sentences that earned them."""
    s: dict[str, float] = dict.fromkeys(CLASSES[:-1], 0.0)
    ev: dict[str, list[str]] = {k: [] for k in s}
    for rule in (_held_without_compute, _serving, _busy, _lockstep, _windows):
        rule(span, s, ev)
    return s, ev


def _held_without_compute(span: _Span, s: dict[str, float], ev: dict[str, list[str]]) -> None:
    f = span.features
    active = f.get("active", 0.0)
    if f.get("util_median", 0.0) < 0.05 and f.get("util_p90", 0.0) < 0.2 and active < 0.35:
        s["interactive"] += 1.0
        ev["interactive"].append(
            f"memory held with compute in only {active:.0%} of intervals (no steady load)"
        )


def _serving(span: _Span, s: dict[str, float], ev: dict[str, list[str]]) -> None:
    f = span.features
    med, active, std = f.get("util_median", 0.0), f.get("active", 0.0), f.get("util_std", 0.0)
    if active >= 0.35 and med < 0.75:
        s["inference"] += 0.5
        ev["inference"].append(f"active in {active:.0%} of intervals at varying load")
    if f.get("diurnal", 0.0) >= 0.25:
        s["inference"] += 0.7
        ev["inference"].append(f"load follows a daily cycle (R²={f['diurnal']:.2f})")
    if std >= 0.08 and 0.05 <= med < 0.85:
        s["inference"] += 0.3
    if f.get("memory_util_r", 0.0) >= 0.6 and f.get("memory_cv", 0.0) > 0.05:
        s["inference"] += 0.6
        ev["inference"].append(f"memory moves with load (r={f['memory_util_r']:.2f}, a KV cache)")
    if abs(f["memory_median"] - 0.9) <= 0.03 and f.get("memory_cv", 1.0) < 0.02:
        s["inference"] += 0.25
        ev["inference"].append("memory pre-allocated at 0.90 of the device")


def _busy(span: _Span, s: dict[str, float], ev: dict[str, list[str]]) -> None:
    f = span.features
    med, std = f.get("util_median", 0.0), f.get("util_std", 0.0)
    if med >= 0.75 and f.get("busy", 0.0) >= 0.7:
        for cls in ("training", "batch"):
            s[cls] += 0.6
            ev[cls].append(f"busy {f['busy']:.0%} of the time")
    elif 0.2 <= med < 0.75 and std < 0.08 and f.get("memory_cv", 1.0) < 0.05:
        s["training"] += 0.55  # flat, mid utilization on a fixed footprint: a starved job
        ev["training"].append(f"steady {med:.0%} utilization on a fixed footprint")
    low = f.get("busy_low_power", 0.0)
    if low >= 0.03:
        s["training"] += 0.45
        ev["training"].append(
            f"{low:.0%} of busy intervals at low power (ranks waiting in collectives)"
        )
    if "cycle_minutes" in f and med >= 0.5:
        s["training"] += 0.3
        ev["training"].append(
            f"a {f['cycle_minutes']:.0f}-min cycle of dips (checkpoints or evaluation, "
            f"r={f['cycle_r']:.2f})"
        )
    if f.get("nvlink_gbps", 0.0) >= 5.0 and med >= 0.5:
        s["training"] += 0.2
        ev["training"].append(f"NVLink {f['nvlink_gbps']:.0f} GB/s (all-reduce traffic)")


def _lockstep(span: _Span, s: dict[str, float], ev: dict[str, list[str]]) -> None:
    if span.peers >= 1:
        s["training"] += 0.35 + 0.05 * min(span.peers, 7)
        ev["training"].insert(0, f"{span.peers + 1} GPUs in lockstep (r={span.peer_r:.2f})")


def _windows(span: _Span, s: dict[str, float], ev: dict[str, list[str]]) -> None:
    f = span.features
    hours, med = f["hours"], f.get("util_median", 0.0)
    if f.get("recurring", 0.0) >= 1 and hours <= 14:
        s["batch"] += 0.9
        ev["batch"].insert(0, f"a {hours:.0f} h window that recurs daily")
    elif hours <= 12 and f.get("night", 0.0) >= 0.7 and med >= 0.6 and span.peers == 0:
        s["batch"] += 0.5  # a lone night-time run; ranks in lockstep are a training job
        ev["batch"].insert(0, f"a {hours:.0f} h night-time run")
    if hours >= 18 and med >= 0.6:
        s["training"] += 0.3
        ev["training"].append(f"sustained for {hours:.0f} h")


def _overall(gpu: GpuInfo, segments: list[Segment]) -> GpuVerdict:
    if not segments:
        return GpuVerdict(gpu, "idle", 0.5, ("no samples in the window",), ())
    share: dict[str, float] = {}
    for seg in segments:
        share[seg.gpu_class] = share.get(seg.gpu_class, 0.0) + seg.end - seg.start
    total = sum(share.values())
    # The contract: the class of the workload that held the GPU longest; idle only when nothing
    # held it (for more than a sliver of the window, so a blip does not name the GPU).
    held = {k: v for k, v in share.items() if k != "idle" and v >= HELD_FLOOR_RATIO * total}
    best = max(held, key=lambda k: (held[k], k)) if held else "idle"
    main = [s for s in segments if s.gpu_class == best]
    confidence = round(
        sum(s.confidence * (s.end - s.start) for s in main)
        / max(sum(s.end - s.start for s in main), 1e-9),
        2,
    )
    evidence = [f"{best} for {share[best] / total:.0%} of the window"]
    if share.get("idle", 0.0) > 0 and best != "idle":
        evidence.append(f"idle for {share['idle'] / total:.0%}")
    longest = max(main, key=lambda s: s.end - s.start)
    evidence += list(longest.evidence)
    return GpuVerdict(gpu, best, confidence, tuple(evidence), tuple(segments))
