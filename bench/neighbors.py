"""Noisy neighbours that start together: `python bench/neighbors.py [--seeds N] [--json]`.

Issue #23 (5): time-sliced co-tenants that start together were never reported (0 of 20 on a
real co-location set), because a victim's solo reference was matched by job id. This bench
builds stores of GPUs shared by two tenants, in the shapes that matter, and scores the
``noisy_neighbor`` findings of :func:`analyzer.analysis.analyze` against the truth:

* ``twin``: two tenants start together on a saturated GPU; each workload (the same command line
  or pod template, another job id, seed, rank, port and run directory) ran alone for hours on
  another GPU of the same model on another node (its demand within 7% of this run's). Right
  answer: a finding per slowed tenant, ``slowdown_ratio`` within 0.10 of the truth.
* ``never_solo``: the same, with no solo run of either workload on that GPU model anywhere; the
  decoys are the same script at another batch size alone on the same model, and the same
  workload alone on another model. Right answer: a finding with ``slowdown_ratio`` null.
* ``fits``: two tenants whose solo demands fit the GPU side by side (sum under 0.8), with and
  without twins. Right answer: no finding.
* ``unharmed``: a light tenant (0.2-0.3 of the GPU) starts with a greedy one (0.95-1.0); the
  light one gets all it asks for. Right answer: a finding for the greedy one only (measured
  where it has a twin, else null), nothing for the light one, with or without its twin.
* ``outlives``: two start together and one runs on alone for 1-2 h after the other ends: the
  survivor is measured from its own solo time, the other from its twin (or null without one).
* ``second``: one tenant runs alone for 3 h, then the other joins (with or without a twin
  elsewhere): the case the analyzer handled before, kept as a regression check.

Sharing follows a time-slicer: max-min fair shares of the GPU's time each minute (a tenant
asking for less than an equal split gets all it asks for; the rest is split among the others).
The truth of a tenant is its slowdown, 1 - (mean share) / (mean demand) over the overlap; it is
a victim when that is at least 0.10 (``noisy_min_slowdown_ratio``). Demands are drawn per seed
(greedy 0.7-1.0, light 0.2-0.3 against 0.95-1.0, side by side 0.15-0.4), with per-minute noise
(sd 0.04) and an evaluation dip every 30 minutes.

**What is real and what is not.** ``../shared/data/gavel-placement`` holds Gavel's measured
throughputs of 55 (GPU type, job) pairs on V100, P100 and K80 for *placement* (one server against
spread across servers), not the throughputs of co-located pairs. It gives this bench its
workloads (ResNet-18, ResNet-50, Transformer and LM at Gavel's batch sizes, each on the GPU type
it was measured on, 4 GPUs a node) and so the identity and solo-reference shapes; the demands
and slowdowns are synthetic, from the sharing model above. Without the data folder the bench
stops with a message.

``--proportional`` shares each GPU in proportion to demand instead (the simulator's model in
``sim/engine.py``: a light tenant is slowed as much as a greedy one), to show what the
detector's equal-split rule costs when the device does not share fairly.

Seeds 1 to N are the tuning split (the detector's thresholds were chosen looking at seed 1);
seeds 101 to 100+N are held out. Both are printed.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.store import Store
from analyzer.analysis import analyze
from sim.traces import data_root
from store.schema import Device, GpuSample, Pod, Process, ProcessSample

T0 = 1_763_251_200.0  # 2025-11-16T00:00:00Z
STEP = 60.0
GIB = 1 << 30
MIN_SLOWDOWN = 0.10
#: Gavel's GPU types as nvidia-smi names them, with memory and board power (datasheets).
MODELS = {
    "v100": ("Tesla V100-SXM2-16GB", 16 * GIB, 300.0, 40.0),
    "p100": ("Tesla P100-PCIE-16GB", 16 * GIB, 250.0, 30.0),
    "k80": ("Tesla K80", 12 * GIB, 149.0, 25.0),
}
#: Gavel's models as the command lines that would train them.
SCRIPTS = {
    "ResNet-18": ("image_classification/cifar10/main.py", "--arch resnet18"),
    "ResNet-50": ("image_classification/imagenet/main.py", "--arch resnet50"),
    "Transformer": ("translation/train.py", "--arch transformer_wmt_en_de"),
    "LM": ("language_modeling/main.py", "--model LSTM --cuda"),
}


@dataclass(frozen=True)
class Job:
    gpu_type: str
    model: str
    batch: int


@dataclass
class Truth:
    uuid: str
    tenant: str
    shape: str
    slowdown: float
    measurable: bool  # a solo reference of its workload exists on the same model

    @property
    def victim(self) -> bool:
        return self.slowdown >= MIN_SLOWDOWN


@dataclass
class Fleet:
    """The store being written: GPUs handed out 4 to a node, per GPU model."""

    rng: random.Random
    records: list[object] = field(default_factory=list)
    truths: list[Truth] = field(default_factory=list)
    used: Counter[str] = field(default_factory=Counter)
    pid: int = 1000
    job_id: int = 40000
    taken: set[Job] = field(default_factory=set)  # workloads a case already runs
    proportional: bool = False  # share the GPU in proportion to demand, not max-min fairly

    def gpu(self, gpu_type: str) -> tuple[str, str, int]:
        n = self.used[gpu_type]
        self.used[gpu_type] += 1
        node, index = f"{gpu_type}-node-{n // 4:02d}", n % 4
        uuid = f"GPU-{gpu_type}-{n:04d}"
        name, memory, limit, _ = MODELS[gpu_type]
        self.records.append(
            Device(node, uuid, index, name, None, memory, limit, None, None, None, T0)
        )
        return node, uuid, index


def gavel_jobs() -> list[Job]:
    root = data_root()
    path = root / "gavel-placement" / "placement_throughputs.csv" if root else None
    if path is None or not path.is_file():
        raise SystemExit("bench/neighbors.py: ../shared/data/gavel-placement not found")
    jobs = set()
    with path.open() as f:
        for row in csv.DictReader(f):
            model, _, rest = row["job"].partition(" (batch size ")
            jobs.add(Job(row["gpu_type"], model, int(rest.rstrip(")"))))
    return sorted(jobs, key=lambda j: (j.gpu_type, j.model, j.batch))


def command(job: Job, rng: random.Random) -> str:
    """One run's command line: the workload's arguments and this run's own ones."""
    script, args = SCRIPTS[job.model]
    python = rng.choice(["python", "python3", "/opt/conda/bin/python3.10", "/usr/bin/python3"])
    stamp = f"2025{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}-{rng.randint(0, 2359):04d}"
    return (
        f"{python} {script} {args} --batch-size {job.batch} --seed {rng.randint(0, 99999)} "
        f"--rank {rng.randint(0, 7)} --dist-url tcp://10.{rng.randint(0, 255)}.0."
        f"{rng.randint(1, 254)}:{rng.randint(20000, 30000)} --checkpoint-dir /ckpt/run-{stamp}"
    )


@dataclass(frozen=True)
class Tenant:
    """One run of a workload: its attribution and its demand (share of the GPU it asks for)."""

    name: str  # the analyzer's name for it
    job: Job
    demand: float
    cmdline: str
    pod: tuple[str, str] | None  # (namespace, name) for a pod, None for a Slurm job


def run_of(fleet: Fleet, job: Job, demand: float, pod_template: str | None) -> Tenant:
    if pod_template is None:
        fleet.job_id += 1 + fleet.rng.randint(0, 40)
        return Tenant(f"slurm job {fleet.job_id}", job, demand, command(job, fleet.rng), None)
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    suffix = "".join(fleet.rng.choice(alphabet) for _ in range(5))
    name = f"{pod_template}-{suffix}"
    return Tenant(f"pod ml/{name}", job, demand, command(job, fleet.rng), ("ml", name))


def demand_series(tenant: Tenant, minutes: int, rng: random.Random) -> list[float]:
    """Per minute: the tenant's demand with noise, and an evaluation dip every 30 minutes."""
    phase = rng.randint(0, 29)
    out = []
    for m in range(minutes):
        level = tenant.demand * (0.3 if (m + phase) % 30 < 2 else 1.0)
        out.append(min(max(rng.gauss(level, 0.04), 0.01), 1.0))
    return out


def max_min_shares(demands: list[float]) -> list[float]:
    """A time-slicer's split of one minute: equal shares, a tenant asking for less keeps only
    what it asks for, and the rest goes to the others (water-filling)."""
    shares = [0.0] * len(demands)
    left, open_ = 1.0, sorted(range(len(demands)), key=lambda i: demands[i])
    while open_:
        equal = left / len(open_)
        i = open_[0]
        if demands[i] <= equal:
            shares[i] = demands[i]
            left -= demands[i]
            open_.pop(0)
        else:
            for j in open_:
                shares[j] = equal
            break
    return shares


def proportional_shares(demands: list[float]) -> list[float]:
    """The simulator's sharing (sim/engine.py): every tenant slowed by the same factor when the
    demands exceed the GPU, a light one too."""
    total = sum(demands)
    return [d / total if total > 1.0 else d for d in demands]


def place(
    fleet: Fleet, tenants: list[tuple[Tenant, float, float]], gpu_type: str
) -> tuple[str, dict[str, float]]:
    """Run ``(tenant, start hour, end hour)`` on one new GPU of ``gpu_type``: each tenant's
    per-minute share follows :func:`max_min_shares`. Returns the GPU's uuid and each tenant's
    true slowdown while it shared the GPU, 1 - (mean share) / (mean demand)."""
    node, uuid, index = fleet.gpu(gpu_type)
    _, memory, limit, idle = MODELS[gpu_type]
    first = min(s for _, s, _ in tenants)
    minutes = round((max(e for _, _, e in tenants) - first) * 60)
    series = {t.name: demand_series(t, minutes, fleet.rng) for t, _, _ in tenants}
    pids: dict[str, int] = {}
    for t, s, e in tenants:
        fleet.pid += 1
        pids[t.name] = fleet.pid
        fleet.records.append(process(fleet, node, fleet.pid, t, T0 + s * 3600, T0 + e * 3600))
    asked: dict[str, list[float]] = {t.name: [] for t, _, _ in tenants}
    got: dict[str, list[float]] = {t.name: [] for t, _, _ in tenants}
    for m in range(minutes):
        ts = T0 + first * 3600 + m * STEP
        here = [(t, series[t.name][m]) for t, s, e in tenants if s * 3600 <= ts - T0 < e * 3600]
        split = proportional_shares if fleet.proportional else max_min_shares
        shares = split([d for _, d in here])
        busy = min(sum(d for _, d in here), 1.0)
        mems = [int(t.job.batch / 512 * 2 * GIB) + 2 * GIB for t, _ in here]
        fleet.records.append(
            GpuSample(ts, node, uuid, index, True, busy, None, min(sum(mems), memory),
                      power_watts=idle + (limit - idle) * 0.85 * busy)
        )  # fmt: skip
        for (t, demand), share, mem in zip(here, shares, mems, strict=True):
            fleet.records.append(ProcessSample(ts, node, uuid, pids[t.name], None, mem, share))
            if len(here) > 1:
                asked[t.name].append(demand)
                got[t.name].append(share)
    slowdowns = {
        name: 1.0 - statistics.fmean(got[name]) / statistics.fmean(asked[name])
        for name in asked
        if asked[name]
    }
    return uuid, slowdowns


def process(fleet: Fleet, node: str, pid: int, t: Tenant, start: float, end: float) -> object:
    if t.pod is None:
        job = t.name.removeprefix("slurm job ")
        cgroup = f"/slurm/uid_1000/job_{job}/step_0"
        return Process(
            node, pid, None, "python", t.cmdline, "u", cgroup, job, None, None, None, start, end
        )
    uid = f"{fleet.rng.getrandbits(32):08x}-0000-4000-8000-{fleet.rng.getrandbits(48):012x}"
    fleet.records.append(Pod(node, uid, t.pod[0], t.pod[1], end))
    cgroup = f"/kubepods/burstable/pod{uid}/{fleet.rng.getrandbits(64):016x}"
    return Process(
        node, pid, None, "python", t.cmdline, "u", cgroup, None, uid, None, None, start, end
    )


# -- the shapes -----------------------------------------------------------------------------------

ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def template_for(fleet: Fleet, job: Job) -> str | None:
    """A Deployment's pod template for ``job`` in 4 cases of 10, else None (a Slurm job)."""
    if fleet.rng.random() >= 0.4:
        return None
    digest = "".join(fleet.rng.choice(ALPHABET) for _ in range(8)) + fleet.rng.choice("2456789")
    return f"{job.model.lower()}-bs{job.batch}-{digest}"


def same_template(template: str | None, fleet: Fleet) -> str | None:
    """Another ReplicaSet of the same Deployment (a rollout changes the template hash)."""
    if template is None:
        return None
    digest = "".join(fleet.rng.choice(ALPHABET) for _ in range(8)) + fleet.rng.choice("2456789")
    return template.rsplit("-", 1)[0] + "-" + digest


def alone(fleet: Fleet, t: Tenant, template: str | None, gpu_type: str) -> None:
    """Another run of ``t``'s workload, alone for hours on a GPU of ``gpu_type`` elsewhere.
    Its demand differs by up to 7% (another node, other data shards): a reference is close to
    the workload's level, never exactly it."""
    demand = min(t.demand * fleet.rng.uniform(0.93, 1.07), 1.0)
    twin = run_of(fleet, t.job, demand, same_template(template, fleet))
    start = fleet.rng.uniform(0.5, 2.0)
    place(fleet, [(twin, start, start + fleet.rng.uniform(3.0, 5.5))], gpu_type)


def pair_of(fleet: Fleet, jobs: list[Job]) -> tuple[Job, Job]:
    """Two workloads of one GPU type that no other case of this fleet runs: a workload's
    demand is its own, so one workload in two cases would make two different solo levels."""
    free = [j for j in jobs if j not in fleet.taken]
    types = sorted({j.gpu_type for j in free if sum(k.gpu_type == j.gpu_type for k in free) > 1})
    gpu_type = fleet.rng.choice(types)
    a, b = fleet.rng.sample([j for j in free if j.gpu_type == gpu_type], 2)
    fleet.taken |= {a, b}
    return a, b


def co_started(
    fleet: Fleet,
    shape: str,
    jobs: tuple[Job, Job],
    demands: tuple[float, float],
    twins: tuple[bool, bool],
    outlived: float = 0.0,
) -> None:
    """Two tenants start together; with ``outlived`` hours, the second runs on alone after the
    first ends (measured from its own solo time, the first from its twin or null)."""
    templates = [template_for(fleet, j) for j in jobs]
    tenants = [run_of(fleet, j, d, tp) for j, d, tp in zip(jobs, demands, templates, strict=True)]
    gpu_type = jobs[0].gpu_type
    for t, tp, twin in zip(tenants, templates, twins, strict=True):
        if twin:
            alone(fleet, t, tp, gpu_type)
    start = fleet.rng.uniform(7.0, 9.0)
    end = start + fleet.rng.uniform(3.0, 6.0)
    ends = (end, end + outlived)
    uuid, slowdowns = place(
        fleet, [(t, start, e) for t, e in zip(tenants, ends, strict=True)], gpu_type
    )
    measurable = (twins[0], twins[1] or outlived > 0)
    for t, known in zip(tenants, measurable, strict=True):
        fleet.truths.append(Truth(uuid, t.name, shape, slowdowns[t.name], known))


def never_solo(fleet: Fleet, jobs: list[Job]) -> None:
    """Neither workload ran alone on this model; decoys that must not count as references:
    the same script at another batch size alone on the same model, and the same workload alone
    on another model."""
    a, b = pair_of(fleet, jobs)
    greedy = (fleet.rng.uniform(0.7, 1.0), fleet.rng.uniform(0.7, 1.0))
    co_started(fleet, "never_solo", (a, b), greedy, (False, False))
    free = [j for j in jobs if j not in fleet.taken]
    other_batch = [j for j in free if j.gpu_type == a.gpu_type and j.model == a.model]
    if other_batch:
        decoy = fleet.rng.choice(other_batch)
        fleet.taken.add(decoy)
        place(fleet, [(run_of(fleet, decoy, 0.9, None), 1.0, 5.0)], a.gpu_type)
    same = [
        j for j in free if j.gpu_type != b.gpu_type and (j.model, j.batch) == (b.model, b.batch)
    ]
    if same:
        fleet.taken.add(same[0])
        place(fleet, [(run_of(fleet, b, 0.9, None), 1.0, 5.0)], same[0].gpu_type)


def second(fleet: Fleet, jobs: list[Job], twin: bool) -> None:
    """One tenant alone for 3 h, then the other joins (a twin of the newcomer elsewhere or not)."""
    a, b = pair_of(fleet, jobs)
    first = run_of(fleet, a, fleet.rng.uniform(0.7, 1.0), None)
    newcomer = run_of(fleet, b, fleet.rng.uniform(0.7, 1.0), None)
    if twin:
        alone(fleet, newcomer, None, b.gpu_type)
    uuid, slowdowns = place(fleet, [(first, 6.0, 15.0), (newcomer, 9.0, 15.0)], a.gpu_type)
    fleet.truths.append(Truth(uuid, first.name, "second", slowdowns[first.name], True))
    fleet.truths.append(Truth(uuid, newcomer.name, "second", slowdowns[newcomer.name], twin))


def build(seed: int, jobs: list[Job], proportional: bool = False) -> Fleet:
    fleet = Fleet(random.Random(seed), proportional=proportional)
    u = fleet.rng.uniform
    for _ in range(4):
        co_started(fleet, "twin", pair_of(fleet, jobs), (u(0.7, 1.0), u(0.7, 1.0)), (True, True))
    for _ in range(4):
        never_solo(fleet, jobs)
    for i in range(3):
        small = (u(0.15, 0.4), u(0.15, 0.4))
        co_started(fleet, "fits", pair_of(fleet, jobs), small, (i != 0, i != 2))
    for i in range(4):
        light = (u(0.2, 0.3), u(0.95, 1.0))
        co_started(fleet, "unharmed", pair_of(fleet, jobs), light, (i % 2 == 0, i < 2))
    for i in range(2):
        second(fleet, jobs, twin=i == 0)
    for i in range(2):
        greedy = (u(0.7, 1.0), u(0.7, 1.0))
        co_started(fleet, "outlives", pair_of(fleet, jobs), greedy, (i == 0, False), u(1.0, 2.0))
    return fleet


# -- scoring --------------------------------------------------------------------------------------


@dataclass
class Score:
    findings: int = 0
    precise: int = 0
    victims: int = 0
    recalled: int = 0
    measured: int = 0  # victims with a reference that got a number
    within: int = 0  # ... within 0.10 of the truth
    errors: list[float] = field(default_factory=list)
    nulls: int = 0  # victims without a reference
    null_right: int = 0  # ... reported with slowdown null
    claims: list[float] = field(default_factory=list)  # r of each anti-correlation claim
    by_shape: Counter[str] = field(default_factory=Counter)
    misses: list[str] = field(default_factory=list)

    def add(self, other: Score) -> None:
        for name in ("findings", "precise", "victims", "recalled", "measured", "within", "nulls"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.null_right += other.null_right
        self.errors += other.errors
        self.claims += other.claims
        self.by_shape.update(other.by_shape)
        self.misses += other.misses


def score(doc: dict[str, Any], truths: list[Truth], label: str) -> Score:
    s = Score()
    found = {(f["uuid"], f["victim"]): f for f in doc["findings"] if f["kind"] == "noisy_neighbor"}
    truth = {(t.uuid, t.tenant): t for t in truths}
    for key, f in found.items():
        s.findings += 1
        t = truth.get(key)
        s.claims += [f["correlation"] for e in f["evidence"] if "moved against" in e]
        if t is None or not t.victim:
            shape = t.shape if t else "elsewhere"
            s.by_shape[f"false {shape}"] += 1
            s.misses.append(f"{label}: false finding on {key[0]} for {key[1]} ({shape})")
            continue
        s.precise += 1
    for t in truths:
        s.by_shape[f"{t.shape} tenants"] += 1
        if not t.victim:
            continue
        s.victims += 1
        s.by_shape[f"{t.shape} victims"] += 1
        f = found.get((t.uuid, t.tenant))
        if t.measurable:
            s.measured += 1
        else:
            s.nulls += 1
        if f is None:
            s.misses.append(f"{label}: missed {t.tenant} ({t.shape}, slowdown {t.slowdown:.2f})")
            continue
        s.recalled += 1
        s.by_shape[f"{t.shape} found"] += 1
        ratio = f["slowdown_ratio"]
        if t.measurable and ratio is not None:
            s.errors.append(abs(ratio - t.slowdown))
            s.within += int(abs(ratio - t.slowdown) <= 0.10)
        elif not t.measurable and ratio is None:
            s.null_right += 1
        else:
            s.misses.append(
                f"{label}: {t.tenant} ({t.shape}) reported {ratio}, truth {t.slowdown:.2f}"
            )
    return s


def evaluate(seed: int, jobs: list[Job], proportional: bool = False) -> Score:
    fleet = build(seed, jobs, proportional)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.duckdb"
        store = Store(path)
        store.add(fleet.records)
        store.flush()
        store.close()
        doc = analyze([str(path)], since="1d")
    return score(doc, fleet.truths, f"seed {seed}")


def summary(s: Score) -> dict[str, Any]:
    def ratio(a: int, b: int) -> float | None:
        return round(a / b, 3) if b else None

    return {
        "precision": ratio(s.precise, s.findings),
        "recall": ratio(s.recalled, s.victims),
        "findings": s.findings,
        "victims": s.victims,
        "magnitude_within_0.10": f"{s.within}/{s.measured}",
        "magnitude_error_median": round(statistics.median(s.errors), 3) if s.errors else None,
        "magnitude_error_max": round(max(s.errors), 3) if s.errors else None,
        "null_where_no_reference": f"{s.null_right}/{s.nulls}",
        "anticorrelation_claims": len(s.claims),
        "anticorrelation_max_r": round(max(s.claims), 3) if s.claims else None,
        "by_shape": dict(sorted(s.by_shape.items())),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per split (default 3)")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.add_argument(
        "--proportional",
        action="store_true",
        help="share each GPU in proportion to demand (the simulator's model), not max-min",
    )
    args = parser.parse_args()
    jobs = gavel_jobs()
    out = {}
    for split, base in (("tuning", 0), ("held-out", 100)):
        total = Score()
        for seed in range(base + 1, base + args.seeds + 1):
            total.add(evaluate(seed, jobs, args.proportional))
        out[split] = summary(total) | {"misses": total.misses}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"noisy neighbours that start together ({len(jobs)} Gavel workloads, "
        f"{args.seeds} seeds a split)"
    )
    for split, result in out.items():
        print(f"\n{split}:")
        for key, value in result.items():
            if key != "misses":
                print(f"  {key}: {value}")
        for miss in result["misses"]:
            print(f"  {miss}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
