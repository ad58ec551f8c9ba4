"""Owners and money: the window's GPU-hours per owner, shared GPUs split by measured share, and
what they cost, so that the owners' lines add up to the fleet's bill.

Every GPU-interval (bucket) of the window is accounted exactly once:

* held by one workload (a Slurm job, a pod, a systemd unit, a process): all of it to that
  workload's owner;
* held by several at once (time-slicing, MPS): split by each workload's own SM utilization from
  NVML's per-process samples when every one of them reports it and together they ran something,
  else by the memory each holds, else evenly; the owner's evidence says how much was split how;
* held by nobody: ``(unowned)`` when the GPU sat idle (``idle_gpu_hours``, the idle capacity
  nobody is charged for), ``(unattributed)`` when it held memory or computed but no process was
  seen (an import without process data, a process in a PID namespace the agent cannot see).

A workload's owner is the first team in ``[owners.teams]`` that names its user, namespace or
account; else its pod's namespace; else its Slurm job's account (``[owners.accounts]``); else its
user (the process's uid as the agent resolved it); else ``(unattributed)``.

With ``[prices]``, an interval costs its GPU-hours times its GPU model's price, plus its measured
energy (mean power times length) times the price per kWh; each owner's ``cost`` is its share of
that, and each finding's ``cost`` is its lost GPU-hours times its GPU's price. The ``bill`` is the
sum over every interval, so the owners' costs add up to it.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analyzer.classify import CLASSES
from analyzer.context import (
    CARRY_SECONDS,
    CLASS_CODES,
    IDLE_CODE,
    Context,
    Finding,
    Floats,
    GpuView,
    HolderRuns,
    Ints,
    Mask,
    add_by,
    first_seen,
    running_sum,
)
from analyzer.idle_held import NO_PROCESS
from analyzer.load import Tenant, TenantBucket
from analyzer.mig import COMPUTE_SLICES, slices
from analyzer.prices import Accounting

UNOWNED = "(unowned)"
UNATTRIBUTED = "(unattributed)"
#: The owner kinds of the contract's ``owners[]``.
CONTRACT_KINDS = ("user", "team", "namespace", "account")
#: How an interval's GPU-hours went to its holders.
BASES = ("alone", "sm", "memory", "even")
_BASIS_WORDS = {
    "sm": "per-process SM utilization",
    "memory": "memory held",
    "even": "evenly (no per-process measure)",
}
_JOULES_PER_KWH = 3.6e6


@dataclass(slots=True)
class _Owner:
    name: str
    kind: str
    gpu_hours: dict[str, float] = field(default_factory=dict)
    idle_gpu_hours: float = 0.0
    lost: dict[str, float] = field(default_factory=dict)  # finding kind -> GPU-hours
    energy_kwh: float = 0.0
    cost: float = 0.0
    waste_cost: float = 0.0
    basis: dict[str, float] = field(default_factory=dict)  # split basis -> GPU-hours
    gpus: set[str] = field(default_factory=set)
    workloads: dict[str, float] = field(default_factory=dict)
    members: set[str] = field(default_factory=set)
    unpartitioned_cost: float = 0.0  # MIG slices no instance holds (idle capacity)


@dataclass(slots=True)
class _GpuBooks:
    """One GPU's share of the ledger, built up interval by interval."""

    gpu_hours: dict[str, float] = field(default_factory=dict)
    owners: dict[str, float] = field(default_factory=dict)  # owner -> GPU-hours held
    cost: float | None = None


@dataclass(frozen=True, slots=True)
class Books:
    """The accounting of one window: the owners, the bill, and each finding's owner and cost
    (aligned with the findings given)."""

    owners: tuple[dict[str, Any], ...]
    bill: dict[str, Any]
    findings: tuple[dict[str, Any], ...]
    #: Per GPU (uuid): its GPU-hours by class, its owner (the one that held it longest) and
    #: its cost (``None`` unpriced), for ``gpus[]`` and the per-GPU CSV.
    gpus: dict[str, dict[str, Any]] = field(default_factory=dict)


def account(
    ctx: Context, findings: tuple[Finding, ...], accounting: Accounting | None = None
) -> Books:
    """Account every GPU-interval of the window (the detectors' context, ``ctx``) to an
    owner, and price it."""
    ledger = _Ledger(ctx, accounting or Accounting())
    for view in ctx.views.values():
        ledger.add_gpu(view)
    ledger.add_unpartitioned()
    per_finding = tuple(ledger.add_finding(f) for f in findings)
    return Books(ledger.owners_json(), ledger.bill_json(), per_finding, ledger.gpus_json())


class _Ledger:
    def __init__(self, ctx: Context, accounting: Accounting) -> None:
        self.ctx = ctx
        self.acc = accounting
        self.owners: dict[str, _Owner] = {}
        self.gpu_hours = 0.0
        self.energy_kwh = 0.0
        self.energy_hours = 0.0  # GPU-hours whose power was measured
        self.gpu_cost = 0.0
        self.waste: dict[str, float] = {}
        self.models: dict[str, dict[str, Any]] = {}
        self._owner_of: dict[str, tuple[str, str, str | None]] = {}
        self._per_gpu: dict[str, _GpuBooks] = {}

    # -- intervals --------------------------------------------------------------------------

    def add_gpu(self, view: GpuView) -> None:
        """Account the GPU's intervals, all at once: each interval is one or more charges (its
        holders' shares, else ``(unowned)`` or ``(unattributed)``), summed per owner in the
        intervals' order (:func:`analyzer.context.running_sum`: the same floats as one
        interval at a time)."""
        hours = self.ctx.bucket_hours
        price = self._price(view)
        if view.buckets:
            kwh = np.nan_to_num(view.col("power_watts"))
            kwh = kwh * self.ctx.data.bucket_seconds / _JOULES_PER_KWH
            cost = None if price is None else hours * price + kwh * (self._kwh_price() or 0.0)
            n = len(view.buckets)
            self.gpu_hours = running_sum(self.gpu_hours, np.full(n, hours))
            self.energy_kwh = running_sum(self.energy_kwh, kwh)
            measured = int(np.count_nonzero(~np.isnan(view.col("power_watts"))))
            self.energy_hours = running_sum(self.energy_hours, np.full(measured, hours))
            if price is not None:
                self.gpu_cost = running_sum(self.gpu_cost, np.full(n, hours * price))
            self._book(view, _charges(self, view), kwh, cost)
        self._model(view, price)

    def _book(self, view: GpuView, charges: _Charges, kwh: Floats, cost: Floats | None) -> None:
        """Add the GPU's charges to its owners' lines and to its own books."""
        at = charges.bucket
        hours = self.ctx.bucket_hours * charges.share
        kwh_share = kwh[at] * charges.share
        cost_share = None if cost is None else cost[at] * charges.share
        codes = view.class_codes[at]
        mine = self._per_gpu.setdefault(view.info.uuid, _GpuBooks())
        for o in first_seen(charges.owner):
            name, kind, member = charges.owners[o]
            owner = self._owner(name, kind, member)
            ours = charges.owner == o
            for t in first_seen(charges.tenant[ours]):
                if t >= 0:
                    tenant = charges.tenants[t]
                    mask = ours & (charges.tenant == t)
                    owner.workloads[tenant] = running_sum(
                        owner.workloads.get(tenant, 0.0), hours[mask]
                    )
            add_by(owner.gpu_hours, codes[ours], hours[ours], CLASS_CODES)
            owner.energy_kwh = running_sum(owner.energy_kwh, kwh_share[ours])
            if cost_share is not None:
                owner.cost = running_sum(owner.cost, cost_share[ours])
            add_by(owner.basis, charges.basis[ours], hours[ours], BASES)
            owner.gpus.add(view.info.uuid)
            owner.idle_gpu_hours = running_sum(owner.idle_gpu_hours, hours[ours & charges.idle])
        add_by(mine.gpu_hours, codes, hours, CLASS_CODES)
        names = tuple(dict.fromkeys(name for name, _, _ in charges.owners))
        name_of = np.array([names.index(name) for name, _, _ in charges.owners])
        add_by(mine.owners, name_of[charges.owner], hours, names)  # by name, kinds together
        if cost_share is not None:
            mine.cost = running_sum(mine.cost or 0.0, cost_share)

    def gpus_json(self) -> dict[str, dict[str, Any]]:
        """Each GPU's GPU-hours by class, owner and cost (as :class:`Books` ``gpus``)."""
        return {
            uuid: {
                "gpu_hours": {c: round(b.gpu_hours.get(c, 0.0), 2) for c in CLASSES},
                "owner": max(b.owners.items(), key=lambda kv: (kv[1], kv[0]))[0]
                if b.owners
                else None,
                "cost": None if b.cost is None else round(b.cost, 2),
            }
            for uuid, b in self._per_gpu.items()
        }

    # -- owners -----------------------------------------------------------------------------

    def owner_of(self, tenant_name: str) -> tuple[str, str, str | None]:
        """(owner, kind, member) of a workload; ``member`` names it within a team (worked out
        once per workload: it is asked for every interval the workload held)."""
        known = self._owner_of.get(tenant_name)
        if known is None:
            known = self._owner_of[tenant_name] = self._find_owner(tenant_name)
        return known

    def _find_owner(self, tenant_name: str) -> tuple[str, str, str | None]:
        tenant = self.ctx.data.tenants.get(tenant_name)
        if tenant is None:
            return UNATTRIBUTED, "unattributed", None
        attrs = self._attrs(tenant)
        member = _member(attrs)
        team = self.acc.team_of(attrs)
        if team is not None:
            return team, "team", member
        for kind in ("namespace", "account", "user"):
            if attrs[kind]:
                return str(attrs[kind]), kind, member
        return UNATTRIBUTED, "unattributed", None

    def _attrs(self, tenant: Tenant) -> Mapping[str, str | None]:
        # A Slurm job's account is not in the store (the agent reads /proc, and the account is
        # only in the job's environment and in slurmdbd): [owners.accounts] maps users to it.
        account = self.acc.account_of(tenant.user) if tenant.slurm_job_id else None
        return {"user": tenant.user, "namespace": tenant.namespace, "account": account}

    def _owner(self, name: str, kind: str, member: str | None = None) -> _Owner:
        owner = self.owners.get(f"{kind}\0{name}")
        if owner is None:
            owner = self.owners[f"{kind}\0{name}"] = _Owner(name, kind)
        if member is not None:
            owner.members.add(member)
        return owner

    # -- prices -----------------------------------------------------------------------------

    def _price(self, view: GpuView) -> float | None:
        """The price of an hour of this GPU: its model's, or for a MIG instance its compute
        slices' share of it (a 3g.40gb instance-hour is 3/7 of the GPU-hour)."""
        prices = self.acc.prices
        if prices is None:
            return None
        return prices.per_gpu_hour(view.info.model) * _slice_share(view)

    def add_unpartitioned(self) -> None:
        """Compute slices of a MIG-partitioned GPU that no instance holds are idle capacity:
        their share of the GPU's price goes to ``(unowned)`` for every interval its instances
        were seen, so the bill is still the physical GPUs' (they add no GPU-hours: the
        analysis counts instances)."""
        families: dict[str, list[GpuView]] = {}
        for view in self.ctx.views.values():
            if view.info.parent_uuid is not None:
                families.setdefault(view.info.parent_uuid, []).append(view)
        for views in families.values():
            used = sum(slices(v.info.mig_profile) or 0 for v in views)
            free = COMPUTE_SLICES - used
            if free <= 0 or self.acc.prices is None:
                continue
            starts = {b.start for v in views for b in v.buckets}
            cost = (
                len(starts)
                * self.ctx.bucket_hours
                * self.acc.prices.per_gpu_hour(views[0].info.model)
            )
            cost *= free / COMPUTE_SLICES
            owner = self._owner(UNOWNED, "unowned")
            owner.cost += cost
            owner.unpartitioned_cost += cost
            self.gpu_cost += cost

    def _kwh_price(self) -> float | None:
        return None if self.acc.prices is None else self.acc.prices.kwh

    def _model(self, view: GpuView, price: float | None) -> None:
        model = view.info.model or "(unknown model)"
        entry = self.models.setdefault(
            model,
            {
                "model": model,
                "gpus": 0,
                "gpu_hour": None if price is None else round(price, 4),
                "matched": None if self.acc.prices is None else self.acc.prices.matched(model),
            },
        )
        entry["gpus"] += 1

    # -- findings ---------------------------------------------------------------------------

    def add_finding(self, f: Finding) -> dict[str, Any]:
        """The finding's owner and cost; its lost GPU-hours are added to its owner's."""
        view = self.ctx.views.get(f.uuid)
        price = None if view is None else self._price(view)
        cost = None if price is None else f.gpu_hours_lost * price
        names = self._finding_tenants(f)
        owners = [self.owner_of(n) for n in names] or [(UNATTRIBUTED, "unattributed", None)]
        for name, kind, member in owners:
            owner = self._owner(name, kind, member)
            owner.lost[f.kind] = owner.lost.get(f.kind, 0.0) + f.gpu_hours_lost / len(owners)
            if cost is not None and f.kind in ("idle_held", "starved"):
                owner.waste_cost += cost / len(owners)
        if cost is not None:
            self.waste[f.kind] = self.waste.get(f.kind, 0.0) + cost
        label = " and ".join(sorted({name for name, _, _ in owners}))
        return {"owner": label, "cost": None if cost is None else round(cost, 2)}

    def _finding_tenants(self, f: Finding) -> list[str]:
        """The workloads a finding is about: the idle holder(s), the starved job, the victim."""
        fields = {"idle_held": "holder", "starved": "job", "declared_mismatch": "workload"}
        who = f.detail(fields.get(f.kind, "victim"))
        if not isinstance(who, str) or who == NO_PROCESS:
            return []
        if who in self.ctx.data.tenants:
            return [who]
        # idle_held names several holders of one GPU as "A and B"
        return [n for n in who.split(" and ") if n in self.ctx.data.tenants]

    # -- output -----------------------------------------------------------------------------

    def owners_json(self) -> tuple[dict[str, Any], ...]:
        priced = self.acc.prices is not None
        entries = [_owner_json(o, priced) for o in self.owners.values()]
        special = (UNOWNED, UNATTRIBUTED)
        entries.sort(
            key=lambda e: (
                e["owner"] in special,
                -(e["cost"] or 0.0),
                -e["gpu_hours_total"],
                e["owner"],
            )
        )
        return tuple(entries)

    def bill_json(self) -> dict[str, Any]:
        prices = self.acc.prices
        kwh_price = None if prices is None else prices.kwh
        energy_cost = None if kwh_price is None else self.energy_kwh * kwh_price
        total = None if prices is None else self.gpu_cost + (energy_cost or 0.0)
        idle = self.owners.get(f"unowned\0{UNOWNED}")
        return {
            "currency": None if prices is None else prices.currency,
            "gpu_hours": round(self.gpu_hours, 2),
            "gpu_cost": None if prices is None else round(self.gpu_cost, 2),
            "energy_kwh": round(self.energy_kwh, 1),
            # The share of GPU-hours whose power was measured (energy elsewhere is not known).
            "energy_coverage_ratio": round(self.energy_hours / self.gpu_hours, 3)
            if self.gpu_hours
            else None,
            "energy_cost": None if energy_cost is None else round(energy_cost, 2),
            "cost": None if total is None else round(total, 2),
            "waste_cost": None
            if prices is None
            else {
                "idle_unowned": round(idle.cost, 2) if idle else 0.0,
                "idle_held": round(self.waste.get("idle_held", 0.0), 2),
                "starved": round(self.waste.get("starved", 0.0), 2),
                "noisy_neighbor": round(self.waste.get("noisy_neighbor", 0.0), 2),
            },
            "kwh_price": kwh_price,
            "models": sorted(self.models.values(), key=lambda m: str(m["model"])),
        }


@dataclass(frozen=True, slots=True)
class _Charges:
    """One GPU's charges in the order the intervals come: for each, the interval (a position
    in the GPU's buckets), the owner and the workload (positions in ``owners`` and
    ``tenants``; workload -1 for none), the share, how it was split (a position in
    :data:`BASES`) and whether the owner is charged it as idle."""

    bucket: Ints
    owner: Ints
    tenant: Ints
    share: Floats
    basis: Ints
    idle: Mask
    owners: tuple[tuple[str, str, str | None], ...]
    tenants: tuple[str, ...]


def _charges(ledger: _Ledger, view: GpuView) -> _Charges:
    """Who pays for each interval of ``view``: its holders' shares (:func:`split`), the holders
    carried over a sparse process log as :func:`_present` says, else ``(unowned)`` for an idle,
    empty GPU and ``(unattributed)`` otherwise."""
    th = ledger.ctx.thresholds
    owners: dict[tuple[str, str, str | None], int] = {}
    tenants: dict[str, int] = {}
    runs = view.holder_runs  # the holders at each of their times
    block_of = _blocks(runs)
    entries: dict[int, list[tuple[int, int, float, int]]] = {}  # per block, as first met
    met = _first_met(block_of)
    holders = runs.reader(len(met))
    for block, time in met:
        entries[block] = [
            (
                owners.setdefault(ledger.owner_of(name), len(owners)),
                tenants.setdefault(name, len(tenants)),
                share,
                BASES.index(basis),
            )
            for name, share, basis in split(holders(time))
        ]
    ordered = [entries.get(b, []) for b in range(int(block_of.max()) + 1 if len(block_of) else 0)]
    block_sizes = np.array([len(es) for es in ordered] or [0], dtype=np.int64)
    sizes = block_sizes[block_of] if len(block_of) else np.zeros(1, dtype=np.int64)
    offsets = (np.cumsum(block_sizes) - block_sizes)[block_of] if len(block_of) else sizes
    unowned = owners.setdefault((UNOWNED, "unowned", None), len(owners))
    unattributed = owners.setdefault((UNATTRIBUTED, "unattributed", None), len(owners))
    free = view.compute_free_mask(th)
    nobody_idle = (view.class_codes == IDLE_CODE) & ~view.held_mask(th)
    flat = [e for es in ordered for e in es] or [(0, -1, 1.0, 0)]  # (a placeholder: none held)
    e_owner, e_tenant, e_share, e_basis = (np.array(c) for c in zip(*flat, strict=True))
    k = view.tenant_index
    count = np.where(k >= 0, sizes[np.maximum(k, 0)], 1)  # charges per interval
    bucket = np.repeat(np.arange(len(k)), count)
    pos = np.arange(len(bucket)) - np.repeat(np.cumsum(count) - count, count)
    kk = k[bucket]
    held = kk >= 0
    at = np.where(held, offsets[np.maximum(kk, 0)] + pos, 0)
    nobody = nobody_idle[bucket]
    return _Charges(
        bucket,
        np.where(held, e_owner[at], np.where(nobody, unowned, unattributed)),
        np.where(held, e_tenant[at], -1),
        np.where(held, e_share[at], 1.0).astype(np.float64),
        np.where(held, e_basis[at], 0),
        np.where(held, free[bucket], nobody | free[bucket]),
        tuple(owners),
        tuple(tenants),
    )


def _blocks(runs: HolderRuns) -> Ints:
    """For each holders' time, its block of charges: one per lone holder, however many times
    it held the GPU alone (most times), and one per time that several shared it. Worked out
    in C over the times (a Python step per time was most of :func:`account`)."""
    n = len(runs.starts)
    if not n:
        return np.zeros(0, dtype=np.int64)
    lone = runs.counts == 1
    names = runs.first_tenants()
    position = {name: i for i, name in enumerate(dict.fromkeys(names))}
    by_name = np.fromiter(map(position.__getitem__, names), np.int64, n)
    shared = len(position) + np.cumsum(~lone) - 1
    return np.where(lone, by_name, shared)


def _first_met(block_of: Ints) -> list[tuple[int, int]]:
    """(block, its first time) in the order the times first meet them: the order owners and
    workloads are first seen, as one pass over the times would see them."""
    blocks, first = np.unique(block_of, return_index=True)
    order = np.argsort(first)
    return list(zip(blocks[order].tolist(), first[order].tolist(), strict=True))


def split(present: tuple[TenantBucket, ...]) -> list[tuple[str, float, str]]:
    """Each holder's share of one interval and how it was measured: alone; by its own SM
    utilization when every holder reports it and they ran something; else by the memory each
    holds; else evenly. Holders are summed per tenant (the loader already did)."""
    if not present:
        return []
    if len(present) == 1:
        return [(present[0].tenant, 1.0, "alone")]
    sm = [tb.sm_util for tb in present]
    if all(v is not None for v in sm) and sum(v or 0.0 for v in sm) > 0:
        total = sum(v or 0.0 for v in sm)
        return [(tb.tenant, (tb.sm_util or 0.0) / total, "sm") for tb in present]
    memory = [tb.memory_bytes or 0.0 for tb in present]
    if sum(memory) > 0:
        total = sum(memory)
        return [(tb.tenant, m / total, "memory") for tb, m in zip(present, memory, strict=True)]
    return [(tb.tenant, 1.0 / len(present), "even") for tb in present]


def _present(view: GpuView, t: float) -> tuple[TenantBucket, ...]:
    """The holders at ``t``; in an interval without process samples, those seen last within
    ``CARRY_SECONDS`` (a process log sparser than the GPU log), as the detectors do."""
    present = view.tenants.get(t)
    if present:
        return present
    carried = _carried(view, t)
    return view.tenants[carried] if carried is not None else ()


def _carried(view: GpuView, t: float) -> float | None:
    times = view.tenant_times
    i = bisect.bisect_left(times, t)
    if i == 0 or t - times[i - 1] > CARRY_SECONDS:
        return None
    return times[i - 1]


def _slice_share(view: GpuView) -> float:
    """A whole GPU is 1; a MIG instance is its compute slices over the GPU's seven."""
    if view.info.parent_uuid is None:
        return 1.0
    return (slices(view.info.mig_profile) or COMPUTE_SLICES) / COMPUTE_SLICES


def _member(attrs: Mapping[str, str | None]) -> str | None:
    for kind in ("namespace", "account", "user"):
        if attrs[kind]:
            return f"{kind}:{attrs[kind]}"
    return None


def _owner_json(o: _Owner, priced: bool) -> dict[str, Any]:
    total = sum(o.gpu_hours.values())
    return {
        "owner": o.name,
        # The contract's kinds are user|team|namespace|account; the two lines that belong to no
        # workload are the platform's own (kind "team") and say which they are in "special".
        "kind": o.kind if o.kind in CONTRACT_KINDS else "team",
        "special": None if o.kind in CONTRACT_KINDS else o.kind,
        "gpu_hours": {c: round(o.gpu_hours.get(c, 0.0), 2) for c in CLASSES},
        "gpu_hours_total": round(total, 2),
        "idle_gpu_hours": round(o.idle_gpu_hours, 2),
        "idle_held_gpu_hours": round(o.lost.get("idle_held", 0.0), 2),
        "starved_gpu_hours": round(o.lost.get("starved", 0.0), 2),
        "noisy_neighbor_gpu_hours": round(o.lost.get("noisy_neighbor", 0.0), 2),
        "energy_kwh": round(o.energy_kwh, 1),
        "cost": round(o.cost, 2) if priced else None,
        "waste_cost": round(o.waste_cost, 2) if priced else None,
        "gpus": len(o.gpus),
        "members": sorted(o.members),
        "workloads": [n for n, _ in sorted(o.workloads.items(), key=lambda kv: (-kv[1], kv[0]))],
        "evidence": _evidence(o, total),
    }


def _evidence(o: _Owner, total: float) -> list[str]:
    out = []
    if o.name == UNOWNED:
        out.append(f"{total:.1f} GPU-hours on GPUs no workload held (idle capacity)")
        if o.unpartitioned_cost > 0:
            out.append(
                f"{o.unpartitioned_cost:,.2f} of its cost is MIG compute slices no instance holds"
            )
    elif o.name == UNATTRIBUTED:
        named = sum(o.workloads.values())
        if total - named > 0.05:
            out.append(
                f"{total - named:.1f} GPU-hours of memory held or compute with no process seen "
                "(an import without process data, or a process the agent cannot see)"
            )
        if o.workloads:
            out.append(
                f"{named:.1f} GPU-hours of workloads with no user, namespace or account: "
                + ", ".join(list(o.workloads)[:5])
            )
    shared = {b: h for b, h in o.basis.items() if b != "alone" and h > 0}
    if shared:
        parts = [f"{h:.1f} GPU-h by {_BASIS_WORDS[b]}" for b, h in sorted(shared.items())]
        out.append(
            f"shared GPUs split by measured share: {', '.join(parts)}; "
            f"{o.basis.get('alone', 0.0):.1f} GPU-h held alone"
        )
    elif o.name not in (UNOWNED, UNATTRIBUTED):
        gpus = f"{len(o.gpus)} GPU" + ("" if len(o.gpus) == 1 else "s")
        out.append(f"{total:.1f} GPU-hours on {gpus}, none shared")
    if o.members and o.kind == "team":
        out.append("team of " + ", ".join(sorted(o.members)))
    return out
