"""Which findings to tell their owners about, and which of those were told already.

An owner notice goes to the person who can act: the user holding GPUs idle for over
``idle_held_hours`` (one idle-held finding per GPU), or running a job starved for over
``starved_gpu_hours`` GPU-hours in all (its starved findings). Each notice names the GPUs, the
evidence and the fix. A finding is told once: it is the same finding on a later run when the
same workload, kind and GPU overlap in time what was told (an idle stretch that goes on, a
window that slid), so the state is (kind, subject, GPU, span), not a hash of mutable numbers.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from typing import Any

from store.schema import NoticeSent

FIX = {
    "idle_held": (
        "release the GPU when the work is done (end the job, stop the notebook's kernel or scale "
        "the deployment down); it holds memory others could use"
    ),
    "input_cpu": "raise the DataLoader's workers or ask for more CPUs per GPU",
    "input_io": "stage the data on local disk or raise the loader's prefetch",
    "network": "keep the job's nodes close (one switch) or move less data per step",
    "communication": "overlap communication with compute; checkpoint asynchronously",
    "throttled": "report the node to the admins (power cap or cooling)",
    "unknown": "profile a few steps (torch.profiler) to see what the GPUs wait on",
}


@dataclass(frozen=True, slots=True)
class NoticeRules:
    """When a finding is worth a message to its owner."""

    idle_held_hours: float = 4.0
    starved_gpu_hours: float = 8.0


@dataclass(frozen=True, slots=True)
class Notice:
    """One finding to tell its owner about."""

    finding_id: str
    kind: str  # idle_held | starved
    subject: str  # the workload: 'slurm job 41009'
    user: str | None
    node: str
    gpu: int
    uuid: str
    start_ts: float
    end_ts: float
    gpu_hours: float
    evidence: tuple[str, ...]
    fix: str
    cost: float | None = None
    owner: str | None = None  # the owner owners[] accounts it to (a team, account, namespace)
    #: A starved finding's GPU-hours by cause (the analysis's split), largest first.
    causes: tuple[tuple[str, float], ...] = ()


def _ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def finding_id(kind: str, subject: str, uuid: str, start_ts: float) -> str:
    """A stable name for a finding: the same on every run that sees the same start."""
    key = f"{kind}|{subject}|{uuid}|{start_ts:.0f}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def choose(doc: dict[str, Any], users: dict[str, str], rules: NoticeRules) -> list[Notice]:
    """The analysis's findings worth an owner notice. ``users`` maps a workload (the analysis's
    name for it) to its user, for findings that do not carry one (starved)."""
    out: list[Notice] = []
    starved_by_job: dict[str, float] = {}
    for f in doc.get("findings", []):
        if f["kind"] == "starved" and f.get("job"):
            starved_by_job[f["job"]] = starved_by_job.get(f["job"], 0.0) + f["gpu_hours_lost"]
    for f in doc.get("findings", []):
        if f["kind"] == "idle_held" and f.get("holder"):
            idle_hours = float(f.get("idle_held_seconds") or 0.0) / 3600.0
            if idle_hours >= rules.idle_held_hours:
                out.append(_notice(f, f["holder"], f.get("user") or users.get(f["holder"])))
        elif (
            f["kind"] == "starved"
            and f.get("job")
            and starved_by_job[f["job"]] >= rules.starved_gpu_hours
        ):
            out.append(_notice(f, f["job"], users.get(f["job"])))
    return out


def _notice(f: dict[str, Any], subject: str, user: str | None) -> Notice:
    start, end = _ts(f["start"]), _ts(f["end"])
    fix = FIX["idle_held"] if f["kind"] == "idle_held" else FIX.get(f.get("cause") or "", "")
    cost = f.get("cost")
    return Notice(
        finding_id=finding_id(f["kind"], subject, f["uuid"], start),
        kind=f["kind"],
        subject=subject,
        user=user,
        node=f["node"],
        gpu=int(f["gpu"]),
        uuid=f["uuid"],
        start_ts=start,
        end_ts=end,
        gpu_hours=float(f["gpu_hours_lost"]),
        evidence=tuple(f.get("evidence", [])),
        fix=fix or FIX["unknown"],
        cost=float(cost) if isinstance(cost, int | float) else None,
        owner=f.get("owner"),
        causes=_causes(f),
    )


def _causes(f: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    if f["kind"] != "starved":
        return ()
    split = f.get("causes") or {f["cause"]: f["gpu_hours_lost"]}
    return tuple(sorted(((str(c), float(h)) for c, h in split.items()), key=lambda kv: -kv[1]))


def job_causes(notices: list[Notice]) -> list[tuple[str, float]]:
    """A workload's waiting by cause over all its notices' GPUs (GPU-hours), largest first: the
    sum ``aiscope job`` and the report show, not one GPU's (issue 24)."""
    total: dict[str, float] = {}
    for n in notices:
        for cause, hours in n.causes:
            total[cause] = total.get(cause, 0.0) + hours
    return sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))


def told(notice: Notice, sent: list[NoticeSent]) -> bool:
    """Whether this finding was told already: the same kind, workload and GPU, over a span that
    overlaps one told before."""
    return any(
        s.kind == notice.kind
        and s.subject == notice.subject
        and s.uuid == notice.uuid
        and s.start_ts <= notice.end_ts
        and notice.start_ts <= s.end_ts
        for s in sent
    )
