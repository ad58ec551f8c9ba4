"""``aiscope job ID``: one workload's efficiency summary (the ``aiscope.job/1`` document).

A workload is a Slurm job, a pod (``NAMESPACE/NAME`` or its UID) or a systemd unit: the
identities attribution gives every GPU process. The summary is the fleet analysis itself
(:func:`analyzer.analysis.analyze`, over a window that covers the job) restricted to the job's GPUs
and its time, so its class and findings are the ones ``aiscope analyze`` reports for them; to
that it adds what a user asks of a job (as Princeton's jobstats prints it): per-GPU utilization,
SM activity, memory peak against the device, power against the limit, waiting and its cause,
and one verdict: the change that would save the most GPU-hours, computed from the evidence.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

from analyzer.analysis import analyze, iso
from analyzer.load import Holding, Holdings, InputError, Usage, holdings, inputs, usage
from analyzer.prices import Accounting
from analyzer.recommendations.consolidate import profiles_for
from analyzer.thresholds import Thresholds
from analyzer.window import parse_window

SCHEMA = "aiscope.job/1"
GIB = float(1 << 30)
HOUR = 3600.0
DEFAULT_SINCE_SECONDS = 7 * 86400.0
#: A change worth a verdict saves at least this share of the job's GPU-hours (and 0.1 GPU-h).
VERDICT_MIN_SHARE = 0.05
#: Memory right-sizing: headroom over the measured peak, and the busiest share a slice must hold.
MEMORY_HEADROOM = 1.10
#: Right-sizing is offered only when the peak leaves at least half of the device unused.
RIGHTSIZE_MAX_MEMORY_RATIO = 0.5

ADVICE = {
    "input_cpu": (
        "input-bound: {ratio:.0%} of the time waiting on CPU; raise DataLoader workers "
        "(num_workers) or ask for more CPUs per GPU (--cpus-per-gpu)"
    ),
    "input_io": (
        "input-bound: {ratio:.0%} of the time waiting on storage; stage the data on local disk "
        "or raise the loader's prefetch"
    ),
    "network": (
        "{ratio:.0%} of the time waiting on the network; keep the job's nodes on one switch or "
        "stream less data per step"
    ),
    "communication": (
        "{ratio:.0%} of the time waiting in collectives{straggler}; overlap communication with "
        "compute, checkpoint asynchronously or less often"
    ),
    "throttled": (
        "clocks throttled by a power or thermal limit {ratio:.0%} of the time; report the "
        "node(s) to the admins (cooling, power cap)"
    ),
    "unknown": (
        "{ratio:.0%} of the time the GPUs waited, cause not measured; profile the step "
        "(torch.profiler) to see what it waits on"
    ),
}


class UnknownJob(InputError):
    """No workload of that id in the stores (exit 2)."""

    def __init__(self, message: str, nearest: list[str]) -> None:
        super().__init__(message)
        self.nearest = nearest


@dataclass(frozen=True, slots=True)
class Job:
    """The workload: its analysis name, the ids it is known by, and its holdings per GPU."""

    tenant: str
    kind: str  # slurm | pod | unit | process
    ids: dict[str, str | None]
    user: str | None
    holdings: tuple[Holding, ...]

    @property
    def start(self) -> float:
        return min(h.first_ts for h in self.holdings)

    @property
    def end(self) -> float:
        return max(h.last_ts for h in self.holdings)


def aliases(h: Holding) -> set[str]:
    """Every string a user may name this workload by."""
    names = {h.tenant}
    for value in (h.slurm_job_id, h.pod_uid, h.systemd_unit):
        if value:
            names.add(value)
    if h.pod_namespace and h.pod_name:
        names.add(f"{h.pod_namespace}/{h.pod_name}")
    if h.systemd_unit and h.systemd_unit.endswith(".service"):
        names.add(h.systemd_unit.removesuffix(".service"))
    for prefix in ("slurm job ", "pod ", "unit "):
        if h.tenant.startswith(prefix):
            names.add(h.tenant.removeprefix(prefix))
    return names


def _primary(h: Holding) -> str:
    """The one id to list for a workload (the Slurm id, the pod's name, the unit)."""
    if h.slurm_job_id:
        return h.slurm_job_id
    if h.pod_namespace and h.pod_name:
        return f"{h.pod_namespace}/{h.pod_name}"
    return h.pod_uid or h.systemd_unit or h.tenant


def find_job(found: Holdings, job_id: str) -> Job:
    """The workload named ``job_id``; :class:`UnknownJob` (with the nearest ids) when none."""
    wanted = job_id.strip()
    mine = [h for h in found.holdings if wanted in aliases(h)]
    tenants = sorted({h.tenant for h in mine})
    if not mine:
        near = nearest(wanted, found)
        hint = f"; nearest known: {', '.join(near)}" if near else "; the stores hold no workloads"
        raise UnknownJob(
            f"job {wanted}: no Slurm job, pod or systemd unit of that id in the stores{hint}", near
        )
    if len(tenants) > 1:
        raise InputError(f"job {wanted}: ambiguous, it names {', '.join(tenants)}; give one")
    first = mine[0]
    kind = next(
        (
            k
            for k, p in (("slurm", "slurm job "), ("pod", "pod "), ("unit", "unit "))
            if first.tenant.startswith(p)
        ),
        "process",
    )
    ids = {
        "slurm_job_id": first.slurm_job_id,
        "pod_uid": next((h.pod_uid for h in mine if h.pod_uid), None),
        "pod": f"{first.pod_namespace}/{first.pod_name}" if first.pod_name else None,
        "systemd_unit": first.systemd_unit,
    }
    user = next((h.user for h in mine if h.user), None)
    return Job(first.tenant, kind, ids, user, tuple(mine))


def nearest(job_id: str, found: Holdings, n: int = 5) -> list[str]:
    """Known ids closest to ``job_id``: numerically for Slurm ids, by spelling otherwise."""
    known = sorted({_primary(h) for h in found.holdings})
    if job_id.isdigit():
        numeric = [k for k in known if k.isdigit()]
        if numeric:
            return sorted(numeric, key=lambda k: (abs(int(k) - int(job_id)), k))[:n]
    close = difflib.get_close_matches(job_id, known, n=n, cutoff=0.4)
    return close or known[:n]


def covering_since(job: Job, newest_ts: float | None) -> str:
    """The analysis window: the default week, or longer when the job started before it."""
    if newest_ts is None:
        return "7d"
    # Within a bucket of the default week is the default week (its first bucket starts there).
    needed = newest_ts - job.start
    return "7d" if needed <= DEFAULT_SINCE_SECONDS + 600.0 else f"{math.ceil(needed / HOUR) + 1}h"


def job_summary(
    stores: list[str],
    job_id: str,
    since: str | None = None,
    timeout: float = 10.0,
    thresholds: Thresholds | None = None,
    ended: bool = False,
    allocated: tuple[str, tuple[int, ...]] | None = None,
    accounting: Accounting | None = None,
    analyses: dict[str, dict[str, Any]] | None = None,
    until: str | None = None,
) -> dict[str, Any]:
    """The ``aiscope.job/1`` document of ``job_id`` in ``stores``.

    ``since`` is the analysis window (default: a week, or as long as the job); ``ended`` says the
    job is over (the epilog knows; the stores may not yet); ``allocated`` is (node, GPU indexes)
    the scheduler gave the job there, so GPUs it never touched count too; ``accounting``
    (``[owners]``, ``[prices]``) gives the job its owner and its GPU-hours a price;
    ``analyses`` keeps the analyses made, by window, for the next job of the same stores.
    """
    paths = inputs(stores)
    found = holdings(paths, timeout)
    job = find_job(found, job_id)
    parse_window(since or "7d", until)  # ``--until``: the window ends there (a TIME)
    window = since or covering_since(job, found.newest_ts)
    cache = {} if analyses is None else analyses
    key = window if until is None else f"{window}..{until}"
    if key not in cache:
        cache[key] = analyze(stores, window, timeout, thresholds, accounting, until)
    doc = cache[key]
    spans = _spans(job, doc, found, allocated)
    used = usage(paths, spans, timeout)
    return build(job_id, job, doc, used, found, spans, ended, window, thresholds or Thresholds())


def _spans(
    job: Job,
    doc: dict[str, Any],
    found: Holdings,
    allocated: tuple[str, tuple[int, ...]] | None,
) -> list[tuple[str, str, float, float]]:
    """(node, uuid, start, end) per GPU of the job, clipped to the analysis window; allocated
    GPUs without the job's processes span the job's whole time."""
    lo, hi = _ts(doc["window"]["start"]), _ts(doc["window"]["end"])
    # The document's times are whole seconds: a span never ends before it starts.
    spans = {
        (h.node, h.uuid): (max(h.first_ts, lo), max(min(h.last_ts, hi), h.first_ts, lo))
        for h in job.holdings
        if h.last_ts >= lo
    }
    if not spans:
        raise InputError(
            f"{job.tenant}: last seen {iso(job.end)}, before the analysis window "
            f"({doc['window']['start']}); widen --since"
        )
    if allocated is not None:
        node, indexes = allocated
        start, end = max(job.start, lo), min(job.end, hi)
        for n, uuid, index in found.devices:
            if n == node and index in indexes:
                spans.setdefault((n, uuid), (start, end))
    return [(n, u, s, e) for (n, u), (s, e) in spans.items()]


def _ts(text: str) -> float:
    import datetime as dt  # noqa: PLC0415

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def build(
    job_id: str,
    job: Job,
    doc: dict[str, Any],
    used: dict[tuple[str, str], Usage],
    found: Holdings,
    spans: list[tuple[str, str, float, float]],
    ended: bool,
    since: str,
    th: Thresholds,
) -> dict[str, Any]:
    """The document, from the analysis, the job's holdings and its GPUs' raw usage."""
    by_uuid = {g["uuid"]: g for g in doc["gpus"]}
    start, end = min(s for *_, s, _ in spans), max(e for *_, e in spans)
    findings = job_findings(doc, job.tenant, {u for _, u, _, _ in spans}, start, end)
    mine = {(h.node, h.uuid): h for h in job.holdings}
    gpus = [
        _gpu(
            by_uuid.get(uuid, {}),
            (node, uuid, s, e),
            used.get((node, uuid)),
            mine.get((node, uuid)),
            findings,
            th,
        )
        for node, uuid, s, e in sorted(spans, key=lambda x: (x[0], _index(by_uuid, x[1]), x[1]))
    ]
    running = not ended and any(
        h.last_ts >= found.newest_scan_ts.get(h.node, math.inf) for h in job.holdings
    )
    gpu_hours = sum(g["held_hours"] for g in gpus)
    waiting = _waiting(findings, job.tenant, gpu_hours)
    cls = _job_class(gpus)
    changes = _changes(gpus, findings, job.tenant, waiting, cls, end - start, th)
    price = _price(doc, gpus)
    for change in changes:
        change["cost"] = None if price is None else round(change["gpu_hours"] * price, 2)
    verdict = _verdict(changes, gpu_hours, end - start, th, waiting["gpu_hours"])
    advice = job_recommendations(doc, job.tenant)
    verdict = _reserved(verdict, advice)
    verdict["cost"] = None if price is None else round(verdict["gpu_hours"] * price, 2)
    return {
        "schema": SCHEMA,
        "job": {
            "id": job_id,
            "name": job.tenant,
            "kind": job.kind,
            "user": job.user,
            "owner": _owner(doc, job.tenant),
            **{k: v for k, v in job.ids.items() if v},
        },
        "state": "running" if running else "ended",
        "window": {"start": iso(start), "end": iso(end), "hours": round((end - start) / HOUR, 2)},
        "analysis": {"since": since, "window": doc["window"], "stores": doc.get("stores", [])},
        "nodes": sorted({g["node"] for g in gpus}),
        "gpu_hours": round(gpu_hours, 2),
        # The job's GPU-hours at its GPUs' prices ([prices]); null without prices.
        "cost": None if price is None else round(gpu_hours * price, 2),
        "currency": (doc.get("bill") or {}).get("currency") if price is not None else None,
        "class": cls,
        # What the job declares itself to be (the analysis's ``declared`` of its GPUs), beside
        # the class its GPUs were observed in; null when it declares nothing.
        "declared": _declared(doc, job.tenant, {u for _, u, _, _ in spans}),
        "waiting": waiting,
        "gpus": gpus,
        "findings": findings,
        "verdict": verdict,
        "changes": changes,
        # The analysis's recommendations for the workload's service (its reservation), as the
        # report shows them.
        "recommendations": advice,
    }


def _declared(doc: dict[str, Any], tenant: str, uuids: set[str]) -> dict[str, Any] | None:
    for g in doc["gpus"]:
        found = g.get("declared")
        if g["uuid"] in uuids and found and found.get("workload") == tenant:
            return dict(found)
    return None


def job_recommendations(doc: dict[str, Any], tenant: str) -> list[dict[str, Any]]:
    """The analysis's recommendations whose pool is this workload or the service it is a
    replica of (a pod of a Deployment)."""
    from analyzer.recommendations.demand import service_name  # noqa: PLC0415

    names = {tenant, service_name(tenant)}
    return [r for r in doc.get("recommendations", []) if r.get("pool") in names]


def _reserved(verdict: dict[str, Any], advice: list[dict[str, Any]]) -> dict[str, Any]:
    """ "Healthy" is not the verdict of a service the analysis would resize (issue 24: the
    report reserved 8 GPUs for a pod that ``aiscope job`` called healthy)."""
    resize = [
        r for r in advice if r["kind"] == "reservation" and r.get("gpus") != r.get("current_gpus")
    ]
    if verdict["action"] != "none" or not resize:
        return verdict
    return {"action": "reservation", "summary": resize[0]["summary"], "gpu_hours": 0.0}


def _owner(doc: dict[str, Any], tenant: str) -> str | None:
    """The owner ``owners[]`` accounts the workload to (a team, account, namespace or user)."""
    for owner in doc.get("owners") or []:
        if tenant in owner.get("workloads", []):
            return str(owner["owner"])
    return None


def _price(doc: dict[str, Any], gpus: list[dict[str, Any]]) -> float | None:
    """The job's mean price per GPU-hour, from the prices the analysis's bill applied to its
    GPUs' models; ``None`` without prices."""
    models = {m["model"]: m.get("gpu_hour") for m in (doc.get("bill") or {}).get("models", [])}
    weighted = [(models.get(g["model"]), g["held_hours"]) for g in gpus]
    if not weighted or any(p is None for p, _ in weighted):
        return None
    hours = sum(h for _, h in weighted)
    return sum(float(p or 0.0) * h for p, h in weighted) / hours if hours else None


def _index(by_uuid: dict[str, Any], uuid: str) -> int:
    return int(by_uuid.get(uuid, {}).get("gpu", -1))


def job_findings(
    doc: dict[str, Any], tenant: str, uuids: set[str], start: float, end: float
) -> list[dict[str, Any]]:
    """The analysis's findings on the job's GPUs over its time, in the analysis's order (costliest
    first): those that name the job, and those that name nobody (a GPU's anonymous workload).
    Each is the analysis's own object, less its sparkline."""
    out = []
    for f in doc["findings"]:
        if f["uuid"] not in uuids or _ts(f["end"]) < start or _ts(f["start"]) > end:
            continue
        keys = ("job", "holder", "victim", "aggressor", "workload")
        named = [f.get(k) for k in keys if f.get(k)]
        if named and tenant not in named:
            continue
        out.append({k: v for k, v in f.items() if k != "series"})
    return out


def _gpu(
    g: dict[str, Any],
    span: tuple[str, str, float, float],
    u: Usage | None,
    holding: Holding | None,
    findings: list[dict[str, Any]],
    th: Thresholds,
) -> dict[str, Any]:
    """One GPU of the job: the analysis's class over the job's time, and the raw usage."""
    node, uuid, start, end = span
    own_memory = holding.memory_max_bytes if holding else None
    # Time the job was seen on the GPU (a nightly job is there at night only); a GPU the
    # scheduler allocated that never saw the job's processes was held all along.
    held = min(holding.held_seconds, end - start) if holding else end - start
    cls, confidence, evidence = _class_over(g.get("segments", []), start, end)
    total = u.memory_total_bytes if u else None
    limit = u.power_limit_watts if u else None
    starved = [f for f in findings if f["kind"] == "starved" and f["uuid"] == uuid]
    ran = None if u is None or u.util_max is None else u.util_max > th.idle_util_ratio
    return {
        "node": node,
        "gpu": g.get("gpu"),
        "uuid": uuid,
        "model": g.get("model"),
        "class": cls,
        "confidence": confidence,
        "evidence": evidence,
        "start": iso(start),
        "end": iso(end),
        "held_hours": round(held / HOUR, 2),
        "ran_kernels": ran,
        "utilization": _r(u.util_mean if u else None),
        "utilization_p95": _r(u.util_p95 if u else None),
        "sm_active": _r(u.sm_active_mean if u else None),
        "memory_peak_bytes": _int(u.memory_max_bytes if u else None),
        "job_memory_peak_bytes": _int(own_memory),
        "memory_total_bytes": _int(total),
        "memory_peak_ratio": _r(_ratio(_peak(own_memory, u), total)),
        "power_watts": _r(u.power_mean_watts if u else None, 1),
        "power_limit_watts": _r(limit, 1),
        "power_ratio": _r(_ratio(u.power_mean_watts if u else None, limit)),
        "waiting_ratio": _r(max((f.get("waiting_ratio") or 0.0 for f in starved), default=None)),
        "samples": u.samples if u else 0,
    }


def _peak(own: float | None, u: Usage | None) -> float | None:
    """The job's own peak where its processes report memory, else the device's."""
    return own if own else (u.memory_max_bytes if u else None)


def _ratio(value: float | None, ref: float | None) -> float | None:
    return None if value is None or not ref else value / ref


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _class_over(
    segments: list[dict[str, Any]], start: float, end: float
) -> tuple[str | None, float | None, list[str]]:
    """The class the analysis gave the GPU for most of ``[start, end]``, its time-weighted
    confidence, and the evidence of the longest segment of that class."""
    weight: dict[str, float] = {}
    scored: dict[str, float] = {}  # confidence x overlap, per class
    best: dict[str, tuple[float, dict[str, Any]]] = {}
    for s in segments:
        seg_start, seg_end = _ts(s["start"]), _ts(s["end"])
        overlap = min(seg_end, end) - max(seg_start, start)
        if end - start < 1.0 and seg_start <= start <= seg_end:
            overlap = 1.0  # a job seen at one instant: the segment that holds it
        if overlap <= 0:
            continue
        scored[s["class"]] = scored.get(s["class"], 0.0) + s["confidence"] * overlap
        weight[s["class"]] = weight.get(s["class"], 0.0) + overlap
        if overlap > best.get(s["class"], (0.0, {}))[0]:
            best[s["class"]] = (overlap, s)
    if not weight:
        return None, None, []
    # The job held the GPU, so its stretches the analysis calls idle are gaps between its runs
    # (a nightly job's days), not its class; idle only when nothing else is seen.
    busy = {c: w for c, w in weight.items() if c != "idle"} or weight
    cls = max(busy, key=lambda c: (busy[c], c))
    conf = scored[cls] / weight[cls]
    return str(cls), round(conf, 2), list(best[cls][1].get("evidence", []))


def _job_class(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """The class held for most of the job's GPU-hours, with the evidence of its busiest GPU."""
    hours: dict[str, float] = {}

    def weight(g: dict[str, Any]) -> float:  # a job seen at one instant weighs its GPUs alike
        return max(float(g["held_hours"]), 1e-6)

    for g in gpus:
        if g["class"]:
            hours[g["class"]] = hours.get(g["class"], 0.0) + weight(g)
    if not hours:
        return {"class": None, "confidence": None, "evidence": []}
    cls = max(hours, key=lambda c: (hours[c], c))
    mine = [g for g in gpus if g["class"] == cls]
    lead = max(mine, key=lambda g: (g["held_hours"], g["confidence"] or 0.0))
    conf = sum((g["confidence"] or 0.0) * weight(g) for g in mine) / hours[cls]
    return {"class": cls, "confidence": round(conf, 2), "evidence": lead["evidence"]}


def _waiting(findings: list[dict[str, Any]], tenant: str, gpu_hours: float) -> dict[str, Any]:
    """The job's waiting from its own starved findings: share of its GPU-hours, and by cause."""
    causes: dict[str, float] = {}
    straggler = None
    for f in findings:
        if f["kind"] == "starved" and f.get("job") in (tenant, None):
            for cause, h in (f.get("causes") or {f["cause"]: f["gpu_hours_lost"]}).items():
                causes[cause] = causes.get(cause, 0.0) + float(h)
            straggler = straggler or f.get("straggler")
    lost = sum(causes.values())
    return {
        "ratio": round(lost / gpu_hours, 3) if gpu_hours else None,
        "gpu_hours": round(lost, 2),
        "cause": max(causes, key=lambda c: (causes[c], c)) if causes else None,
        "causes": {c: round(h, 2) for c, h in sorted(causes.items(), key=lambda kv: -kv[1])},
        "straggler": straggler,
    }


def _changes(
    gpus: list[dict[str, Any]],
    findings: list[dict[str, Any]],
    tenant: str,
    waiting: dict[str, Any],
    cls: dict[str, Any],
    seconds: float,
    th: Thresholds,
) -> list[dict[str, Any]]:
    """Every change the evidence supports, with the GPU-hours it would save, costliest first."""
    out = [
        *_unused(gpus),
        *_idle_held(findings, tenant, cls["class"]),
        *_starved(waiting),
        *_slowed(findings, tenant),
        *_rightsize(gpus, cls["class"]),
    ]
    # A job that never ran a kernel: releasing it is the one change; its idle-held finding is
    # the same waste, and lends its fix.
    release = next((c for c in out if c["action"] == "release"), None)
    idle = next((c for c in out if c["action"] == "release_idle"), None)
    if release is not None and idle is not None:
        release["summary"] += "; " + idle["summary"].split(": ", 1)[-1]
        release["evidence"] += idle["evidence"]
        out.remove(idle)
    # The analysis counts in 5-minute buckets, the job's time in process scans: a change never
    # saves more than the job held.
    total = round(sum(g["held_hours"] for g in gpus), 2)
    for c in out:
        c["gpu_hours"] = min(c["gpu_hours"], total)
    return sorted(out, key=lambda c: -c["gpu_hours"])


def _change(action: str, summary: str, gpu_hours: float, evidence: list[str]) -> dict[str, Any]:
    return {
        "action": action,
        "summary": summary,
        "gpu_hours": round(gpu_hours, 2),
        "evidence": evidence,
    }


def _unused(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    idle = [g for g in gpus if g["ran_kernels"] is False]
    if not idle:
        return []
    names = ", ".join(f"{g['node']}/{g['gpu']}" for g in idle)
    hours = sum(g["held_hours"] for g in idle)
    n, k = len(gpus), len(gpus) - len(idle)
    if k == 0:
        summary = (
            f"release the GPU{'s' if n > 1 else ''}: {n} held for "
            f"{max(g['held_hours'] for g in idle):.1f} h and never ran a kernel"
        )
        return [_change("release", summary, hours, [f"no kernel ran on {names}"])]
    summary = f"ask for {k} GPU{'s' if k > 1 else ''}, not {n}: {len(idle)} never ran a kernel"
    evidence = [f"utilization never above the idle level on {names}"]
    return [_change("fewer_gpus", summary, hours, evidence)]


def _idle_held(
    findings: list[dict[str, Any]], tenant: str, cls: str | None
) -> list[dict[str, Any]]:
    mine = [f for f in findings if f["kind"] == "idle_held" and f.get("holder") == tenant]
    if not mine:
        return []
    hours = sum(f["gpu_hours_lost"] for f in mine)
    longest = max(f.get("longest_seconds") or 0.0 for f in mine) / HOUR
    fix = (
        "stop the notebook's kernel when done, or let an idle culler do it"
        if cls == "interactive"
        else "end the job (or release the GPUs) when it stops computing"
    )
    summary = (
        f"held {len({f['uuid'] for f in mine})} GPU(s) with no compute for {hours:.1f} "
        f"GPU-hours (longest stretch {longest:.1f} h): {fix}"
    )
    return [_change("release_idle", summary, hours, [f["evidence"][0] for f in mine[:3]])]


def _starved(waiting: dict[str, Any]) -> list[dict[str, Any]]:
    """One change per cause of the job's waiting (each has its own fix), with its GPU-hours."""
    if waiting["cause"] is None or not waiting["gpu_hours"]:
        return []
    evidence = [
        f"waited {waiting['gpu_hours']:.1f} of its GPU-hours, by cause: "
        + ", ".join(f"{c} {h:.1f} GPU-h" for c, h in waiting["causes"].items())
    ]
    total = waiting["gpu_hours"]
    out = []
    for cause, hours in waiting["causes"].items():
        straggler = (
            f" (straggler {waiting['straggler']})"
            if waiting.get("straggler") and cause == "communication"
            else ""
        )
        # the share of the job's time spent waiting for this cause
        ratio = (waiting["ratio"] or 0.0) * hours / total
        summary = ADVICE.get(cause, ADVICE["unknown"]).format(ratio=ratio, straggler=straggler)
        out.append(_change(f"starved_{cause}", summary, hours, evidence))
    return out


def _slowed(findings: list[dict[str, Any]], tenant: str) -> list[dict[str, Any]]:
    """A neighbour that slowed the job; where its slowdown could not be measured (it never ran
    alone) but it shared a GPU with a co-tenant, the sharing itself, at 0 GPU-hours."""
    mine = [f for f in findings if f["kind"] == "noisy_neighbor" and f.get("victim") == tenant]
    if not mine:
        return []
    worst = max(mine, key=lambda f: (f["gpu_hours_lost"], f["end"]))
    fix = (
        "ask for exclusive GPUs (no time-slicing or MPS sharing)"
        if worst.get("resource") == "gpu"
        else "ask for exclusive nodes, or report the noisy neighbour to the admins"
    )
    slowdown = worst.get("slowdown_ratio")
    if isinstance(slowdown, int | float) and worst["gpu_hours_lost"] > 0:
        summary = f"{slowdown:.0%} slower while {worst['aggressor']} shared its {worst['resource']}"
    else:
        shared = (_ts(worst["end"]) - _ts(worst["start"])) / HOUR
        summary = (
            f"shared its {worst['resource']} with {worst['aggressor']} for {shared:.1f} h; its own "
            "slowdown could not be measured (it never ran alone)"
        )
    hours = sum(f["gpu_hours_lost"] for f in mine)
    return [_change("isolate", f"{summary}: {fix}", hours, [worst["evidence"][0]])]


def _rightsize(gpus: list[dict[str, Any]], cls: str | None) -> list[dict[str, Any]]:
    """A MIG slice when the job's memory peak and busiest compute both fit one: the peak with
    10% headroom within the slice's memory, p95 utilization within its share of the compute.
    Never for training (a slice would slow it)."""
    busy = [g for g in gpus if g["ran_kernels"] and g["memory_peak_ratio"] is not None]
    if (
        cls == "training"
        or not busy
        or len(busy) < len([g for g in gpus if g["ran_kernels"] is not False])
    ):
        return []
    peak_ratio = max(g["memory_peak_ratio"] for g in busy)
    if peak_ratio > RIGHTSIZE_MAX_MEMORY_RATIO:
        return []
    peak = max(g["job_memory_peak_bytes"] or g["memory_peak_bytes"] or 0 for g in busy)
    total = busy[0]["memory_total_bytes"]
    p95 = max(g["utilization_p95"] or 0.0 for g in busy)
    hours = sum(g["held_hours"] for g in busy)
    fit = _slice(busy[0]["model"], peak * MEMORY_HEADROOM / GIB, p95)
    evidence = [
        f"memory peak {peak / GIB:.0f} GiB of {total / GIB:.0f}" if total else "",
        f"utilization p95 {p95:.0%}",
    ]
    if fit is not None:
        summary = (
            f"memory peak {peak / GIB:.0f} GiB of {total / GIB:.0f}: fits a {fit['name']} MIG "
            f"slice ({fit['slices']}/7 of the GPU)"
        )
        saved = hours * (1.0 - fit["slices"] / 7.0)
        return [_change("smaller_gpu", summary, saved, [e for e in evidence if e])]
    # No slice fits, or the model has none: "a smaller GPU" would be a guess at another model's
    # compute, so nothing is said.
    return []


def _slice(model: str | None, need_gib: float, p95: float) -> dict[str, Any] | None:
    """The smallest MIG profile of ``model`` with the memory and the compute share needed."""
    fits = [
        p
        for p in profiles_for(model)
        if p["memory_gb"] >= need_gib and p["slices"] / 7.0 >= p95 and p["slices"] < 7
    ]
    return min(fits, key=lambda p: (p["slices"], p["memory_gb"])) if fits else None


def _verdict(
    changes: list[dict[str, Any]],
    gpu_hours: float,
    seconds: float,
    th: Thresholds,
    waited: float = 0.0,
) -> dict[str, Any]:
    """The one change that would help most, or "healthy" (or "too short to judge"). Waiting
    counts whole (``waited``): a job that waits 8% of its time, half in collectives and half
    for reasons unmeasured, is worth its costliest cause."""
    floor = max(VERDICT_MIN_SHARE * gpu_hours, 0.1)
    worth = [
        c
        for c in changes
        if c["gpu_hours"] >= floor
        or c["action"] in ("release", "fewer_gpus")
        or (c["action"].startswith("starved_") and waited >= floor)
    ]
    # A neighbour the analysis names but could not measure is still not "healthy".
    unmeasured = [c for c in changes if c["action"] == "isolate"]
    if worth or unmeasured:
        top = (worth or unmeasured)[0]
        return {"action": top["action"], "summary": top["summary"], "gpu_hours": top["gpu_hours"]}
    if seconds < th.min_evidence_seconds:
        return {
            "action": "none",
            "summary": f"too short to judge ({seconds / 60:.0f} min seen)",
            "gpu_hours": 0.0,
        }
    return {"action": "none", "summary": "healthy: nothing found worth changing", "gpu_hours": 0.0}
