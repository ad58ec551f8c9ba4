"""Declared beside observed: what a workload says it is, weighed against what its GPU did.

Runs after classification, on its verdicts (class, confidence, evidence), as its own step
(issue 23, section 2). A GPU's declaration is that of the workload that held it longest in the
window (its *main tenant*), the most specific of the workload's declarations
(``store.intent.strength``: a purpose-built resource over a command-line signature over a
generic controller or a Slurm mode). Imports and scrapes that stored no declaration still have
command lines: their signature stands in.

The rules, with the thresholds they use:

* **Agree** (the observed class is the class the declaration implies): confidence rises, closing
  :data:`AGREE_GAIN` of its distance to 1 (at most :data:`MAX_CONFIDENCE`).
* **Disagree on strong evidence**: the observed class stands, the evidence says so, and the
  GPU gets a ``declared_mismatch`` finding (:func:`detect`) with the GPU-hours it ran against
  its declaration. Strong is a confidence of at least :data:`OBSERVED_STANDS` (the level at
  which verdicts are to be right 9 times in 10) against what the platform was told (an owner
  kind, a Slurm mode: envelopes people misuse, like pre-training in a notebook pod), and at
  least :data:`OBSERVED_STANDS_PROGRAM` against the program itself (its command line's
  signature: a torchrun launcher *is* training code). On the demo, a fine-tune starved by its
  input pipeline read as inference at 0.85 while its torchrun said training.
* **Disagree on weak evidence**: the declared class wins for the segments the declared
  workload held in the observed class, at confidence :data:`DECLARED_WINS_CONFIDENCE`, and the
  evidence states the disagreement.
* A declaration that implies no class (a ``Job``, a Slurm batch job, a systemd unit) changes
  nothing; it is still shown beside the class.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import numpy as np

from analyzer.classify import GpuVerdict, Segment
from analyzer.context import Context, Detected, Finding, GpuView, gpu_name
from analyzer.load import NO_TENANCY, FleetData
from analyzer.reference import computed
from store import intent
from store.intent import Declared

#: The confidence at or above which the observed class stands against a declaration: one the
#: platform was told (owner kind, Slurm mode), and a program's own signature.
OBSERVED_STANDS = 0.8
OBSERVED_STANDS_PROGRAM = 0.9
#: Agreement closes this share of the gap between the confidence and 1.
AGREE_GAIN = 0.5
MAX_CONFIDENCE = 0.98
#: The confidence of a verdict the declaration decided against weak behavioural evidence.
DECLARED_WINS_CONFIDENCE = 0.7
#: A mismatch shorter than this is not a finding (a restart, a warm-up).
MIN_MISMATCH_HOURS = 1.0
KIND = "declared_mismatch"
#: Sources in the order they win a tie of strength.
_SOURCE_ORDER = {s: i for i, s in enumerate(intent.SOURCES)}


def choose(declarations: tuple[Declared, ...]) -> Declared | None:
    """The declaration that speaks for a workload: the strongest, ties by source order."""
    if not declarations:
        return None
    best = max(
        declarations,
        key=lambda d: (intent.strength(d.kind, d.source), -_SOURCE_ORDER.get(d.source, 99)),
    )
    # Of those that imply the same class, the one the platform knows it by (a Deployment
    # rather than the vllm in it) names it.
    same = [d for d in declarations if d.implies == best.implies]
    return min(same, key=lambda d: _SOURCE_ORDER.get(d.source, 99))


def main_tenants(data: FleetData) -> dict[str, str]:
    """uuid -> the tenant present on the GPU in the most buckets (ties by name)."""
    out = {}
    for uuid, buckets in data.tenancy.items():
        counts = buckets.counts()  # from the codes, not a record per bucket
        if counts:
            out[uuid] = max(counts, key=lambda t: (counts[t], t))
    return out


def tenant_declaration(data: FleetData, tenant: str) -> Declared | None:
    """A tenant's stored declarations, else its command line's signature."""
    return choose(_declarations(data, tenant))


def _declarations(data: FleetData, tenant: str) -> tuple[Declared, ...]:
    """Everything a tenant declares: what is stored, and its command line's signature."""
    stored = data.declarations.get(tenant, ())
    if not any(d.source == intent.CMDLINE for d in stored) and tenant in data.tenants:
        found = intent.signature(data.tenants[tenant].command)
        if found is not None:
            stored = (*stored, Declared(found[0], None, str(found[1]), intent.CMDLINE))
    return stored


def by_gpu(data: FleetData) -> dict[str, tuple[str, Declared]]:
    """uuid -> (main tenant, its declaration), for GPUs whose main tenant declares something."""
    out = {}
    for uuid, tenant in main_tenants(data).items():
        declared = tenant_declaration(data, tenant)
        if declared is not None:
            out[uuid] = (tenant, declared)
    return out


def stands_at(d: Declared, concurring: tuple[Declared, ...] = ()) -> float:
    """The confidence the observed class needs to stand against ``d``: the program's own
    signature's bar when it, or a declaration of the same class beside it, is one (a
    Deployment whose containers run vllm declares serving twice, once in the program itself)."""
    sources = {d.source} | {c.source for c in concurring if c.implies == d.implies}
    return OBSERVED_STANDS_PROGRAM if intent.CMDLINE in sources else OBSERVED_STANDS


def bar(data: FleetData, tenant: str) -> float:
    """The confidence the observed class needs to stand against what ``tenant`` declares."""
    d = tenant_declaration(data, tenant)
    return OBSERVED_STANDS if d is None else stands_at(d, _declarations(data, tenant))


def to_json(found: tuple[str, Declared] | None) -> dict[str, Any] | None:
    """The document's ``declared`` object for (main tenant, declaration), or ``None``:
    ``kind``, ``name``, ``implies`` (a class or null) and ``source``, and the ``workload`` that
    declared it (the tenant name findings and ``aiscope job`` use)."""
    if found is None:
        return None
    tenant, declared = found
    return {
        "kind": declared.kind,
        "name": declared.name,
        "implies": declared.implies,
        "source": declared.source,
        "workload": tenant,
    }


# -- combining ------------------------------------------------------------------------------------


def combine(
    data: FleetData,
    verdicts: list[GpuVerdict],
    declared: dict[str, tuple[str, Declared]] | None = None,
) -> list[GpuVerdict]:
    """The verdicts with declared intent weighed in (the module's rules); ``declared``:
    :func:`by_gpu` of ``data`` where the caller has it already (a walk over every tenant
    bucket of the fleet)."""
    declared = by_gpu(data) if declared is None else declared
    return [
        _weigh(v, *declared[v.info.uuid], data) if v.info.uuid in declared else v for v in verdicts
    ]


def _weigh(v: GpuVerdict, tenant: str, d: Declared, data: FleetData) -> GpuVerdict:
    implied = d.implies
    if implied is None or v.gpu_class == "idle":
        return v
    what = _what(d)
    if v.gpu_class == implied:
        raised = round(min(MAX_CONFIDENCE, v.confidence + AGREE_GAIN * (1 - v.confidence)), 2)
        note = f"declared {what} agrees (confidence {v.confidence:.2f} -> {raised:.2f})"
        return _replace(v, v.gpu_class, raised, (*v.evidence, note), v.segments)
    needed = bar(data, tenant)
    if v.confidence >= needed:
        note = (
            f"declared {what}, but the behaviour says {v.gpu_class} on strong evidence "
            f"(confidence {v.confidence:.2f} >= {needed}): the observed class stands"
        )
        return _replace(v, v.gpu_class, v.confidence, (*v.evidence, note), v.segments)
    note = (
        f"{implied} as declared ({what}); the behaviour alone said {v.gpu_class} "
        f"(confidence {v.confidence:.2f} < {needed}), too weak to stand against it"
    )
    segments = tuple(
        _declared_segment(s, v.gpu_class, implied, tenant, data, v) for s in v.segments
    )
    return _replace(v, implied, DECLARED_WINS_CONFIDENCE, (note, *v.evidence), segments)


def _declared_segment(
    s: Segment, observed: str, implied: str, tenant: str, data: FleetData, v: GpuVerdict
) -> Segment:
    """A segment of the observed class that the declared workload held takes the declared
    class; any other segment is left as it was."""
    if s.gpu_class != observed or _segment_tenant(s, data, v.info.uuid) not in (tenant, None):
        return s
    note = f"{implied} as declared; the behaviour alone said {observed}"
    return dataclasses.replace(
        s,
        gpu_class=implied,
        confidence=min(s.confidence, DECLARED_WINS_CONFIDENCE),
        evidence=(note, *s.evidence),
    )


def _segment_tenant(s: Segment, data: FleetData, uuid: str) -> str | None:
    tenancy = data.tenancy.get(uuid, NO_TENANCY)
    starts = tenancy.starts
    counts = tenancy.take(np.flatnonzero((s.start <= starts) & (starts < s.end))).counts()
    return max(counts, key=lambda t: (counts[t], t)) if counts else None


def _replace(
    v: GpuVerdict,
    cls: str,
    confidence: float,
    evidence: tuple[str, ...],
    segments: tuple[Segment, ...],
) -> GpuVerdict:
    return GpuVerdict(v.info, cls, confidence, evidence, segments, v.ref)


def _what(d: Declared) -> str:
    name = f"{d.kind} {d.name}" if d.name else d.kind
    return f"{name} ({d.source}) implies {d.implies}" if d.implies else name


# -- the finding ----------------------------------------------------------------------------------


def detect(ctx: Context, explained: frozenset[tuple[str, float]]) -> Detected:
    """A ``declared_mismatch`` finding per GPU whose workload's behaviour contradicts its
    declaration on strong evidence (:func:`stands_at`), for at least
    :data:`MIN_MISMATCH_HOURS`."""
    declared = by_gpu(ctx.data)
    return counted(ctx, declared, gpus_by_tenant(declared))


def gpus_by_tenant(declared: dict[str, tuple[str, Declared]]) -> dict[str, int]:
    """How many GPUs each declaring tenant is the main tenant of (``declared``:
    :func:`by_gpu`)."""
    return Counter(tenant for tenant, _ in declared.values())


def counted(
    ctx: Context, declared: dict[str, tuple[str, Declared]], spans: dict[str, int]
) -> Detected:
    """:func:`detect` over the GPUs ``declared`` names, the tenants' GPUs counted in ``spans``.
    A tenant's GPUs may be on several batches of nodes (analyzer.stages' Map E): a batch is
    given the fleet's counts, which the driver takes from the whole fleet's :func:`by_gpu`."""
    found = []
    for uuid, (tenant, d) in sorted(declared.items()):
        view = ctx.views.get(uuid)
        if view is None or view.verdict is None or d.implies is None:
            continue
        v = view.verdict
        needed = bar(ctx.data, tenant)
        if v.gpu_class in (d.implies, "idle") or v.confidence < needed:
            continue
        finding = _mismatch(ctx, view, tenant, d, spans[tenant])
        if finding is not None:
            found.append(finding)
    return Detected(tuple(found))


def _mismatch(ctx: Context, view: GpuView, tenant: str, d: Declared, gpus: int) -> Finding | None:
    v = view.verdict
    assert v is not None
    mine = [b for b in view.buckets if view.main_tenant(b.start) == tenant]
    against = [b for b in mine if view.class_at(b.start) == v.gpu_class]
    hours = len(against) * ctx.bucket_hours
    if not against or hours < MIN_MISMATCH_HOURS:
        return None
    measured = [c for c in (computed(b, view.ref, ctx.thresholds) for b in mine) if c is not None]
    ratio = sum(measured) / len(measured) if measured else None
    span = against[-1].start + ctx.data.bucket_seconds - against[0].start
    name = f"{d.kind} {d.name}" if d.name else f"{tenant} ({d.kind})"
    computed_words = f", computed in {ratio:.0%} of intervals" if ratio is not None else ""
    evidence = (
        f"{name}, declared {d.implies}{computed_words} for {_duration(span)}",
        f"{name} runs {gpus} GPU{'s' if gpus > 1 else ''} as {v.gpu_class} "
        f"({gpu_name(view)}: confidence {v.confidence:.2f}, strong behavioural evidence)",
        *v.evidence[:2],
    )
    return Finding(
        KIND,
        view.info.node,
        view.info.gpu_index,
        view.info.uuid,
        against[0].start,
        against[-1].start + ctx.data.bucket_seconds,
        hours,
        evidence,
        (
            ("workload", tenant),
            ("declared_kind", d.kind),
            ("declared_name", d.name),
            ("declared_class", d.implies),
            ("declared_source", d.source),
            ("observed_class", v.gpu_class),
            ("computed_ratio", ratio),
            ("gpus", gpus),
        ),
    )


def _duration(seconds: float) -> str:
    days = seconds / 86400.0
    if days >= 1.5:
        return f"{days:.0f} days"
    return f"{seconds / 3600.0:.0f} hours"
