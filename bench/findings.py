"""Precision and recall of the findings on held-out scenarios: `python bench/findings.py`.

The scenarios in `bench/heldout/` were never used to tune the findings (other GPU models, seeds,
cadences and pathologies than the built-in scenarios, plus negative controls: a healthy job
without checkpoints, two quiet services sharing a GPU). Each is simulated and analyzed with
`aiscope analyze`'s code, and the findings are scored against the scenario's ground truth:

* a truth instance is one (pathology, GPU, workload); it is recalled when a finding of the same
  kind on the same GPU overlaps it in time (for noisy neighbours the victim must match too);
* a finding is precise when it matches some truth instance that way.

Also printed: the share of matched starved findings with the right cause, of noisy-neighbour
findings with the right aggressor; the straggler oracle on Alibaba PAI job 1 (real per-worker
mini-batch times; worker 6 straggles from iteration ~1811); and starved GPU-hours for the same
8xH100 job at four checkpoint cadences (must fall as checkpoints get rarer).

`--tuning` scores the built-in scenarios (the ones the thresholds were tuned on) as well.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import evalset  # bench/evalset.py, beside this script

from agent.attribution import pod_uid_from_cgroup, slurm_job_from_cgroup, systemd_unit_from_cgroup
from analyzer.analysis import analyze
from analyzer.changepoint import find_straggler
from analyzer.neighbors import OUTSIDE
from sim.engine import build_workloads, simulate
from sim.scenario import load
from sim.traces import data_root

HERE = Path(__file__).parent / "heldout"
KINDS = ("starved", "noisy_neighbor", "idle_held")
TUNING = ("demo", "training-multinode", "starved-input", "noisy-timeslice")


@dataclass
class Score:
    found: collections.Counter[str] = field(default_factory=collections.Counter)
    precise: collections.Counter[str] = field(default_factory=collections.Counter)
    truths: collections.Counter[str] = field(default_factory=collections.Counter)
    recalled: collections.Counter[str] = field(default_factory=collections.Counter)
    cause_ok: int = 0
    cause_n: int = 0
    aggressor_ok: int = 0
    aggressor_n: int = 0
    misses: list[str] = field(default_factory=list)

    def add(self, other: Score) -> None:
        for name in ("found", "precise", "truths", "recalled"):
            getattr(self, name).update(getattr(other, name))
        self.cause_ok += other.cause_ok
        self.cause_n += other.cause_n
        self.aggressor_ok += other.aggressor_ok
        self.aggressor_n += other.aggressor_n
        self.misses += other.misses


def tenant_of(cgroup: str, comm: str, pid: int) -> str:
    """The analyzer's tenant name for a simulated workload (see analyzer.load.TENANT_SQL)."""
    if job := slurm_job_from_cgroup(cgroup):
        return f"slurm job {job}"
    if pod := pod_uid_from_cgroup(cgroup):
        return f"pod {pod}"
    if unit := systemd_unit_from_cgroup(cgroup):
        return f"unit {unit}"
    return f"{comm} (pid {pid})"


def tenants(scenario_path: str) -> dict[str, str]:
    scenario = load(scenario_path)
    out = {}
    for w in build_workloads(scenario, scenario.seed):
        procs = [p for node in sorted(w.nodes()) for p in w.processes(node)]
        out[w.name] = tenant_of(procs[0].cgroup, procs[0].comm, procs[0].pid) if procs else OUTSIDE
    return out


def truth(store: Path) -> list[tuple[str, str, float, float, str, dict[str, object]]]:
    con = duckdb.connect(str(store), read_only=True)
    rows = con.execute(
        "SELECT pathology, uuid, start_ts, end_ts, workload, detail FROM ground_truth "
        "WHERE pathology IN ('starved', 'noisy_neighbor', 'idle_held')"
    ).fetchall()
    con.close()
    return [(p, u, s, e, w, json.loads(d)) for p, u, s, e, w, d in rows]


def _ts(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone


def score(doc: dict[str, object], spans: list, names: dict[str, str], label: str) -> Score:
    s = Score()
    instances: dict[tuple[str, str, str], list] = collections.defaultdict(list)
    for span in spans:
        instances[(span[0], span[1], span[4])].append(span)
    findings = doc["findings"]
    assert isinstance(findings, list)

    def matches(f: dict, key: tuple[str, str, str]) -> bool:
        kind, uuid, workload = key
        if f["kind"] != kind or f["uuid"] != uuid:
            return False
        if kind == "noisy_neighbor" and f["victim"] != names.get(workload):
            return False
        start, end = _ts(f["start"]), _ts(f["end"])
        return any(a < end and start < b for _, _, a, b, _, _ in instances[key])

    for key in instances:
        s.truths[key[0]] += 1
        if any(matches(f, key) for f in findings):
            s.recalled[key[0]] += 1
        else:
            s.misses.append(f"{label}: missed {key[0]} of {key[2]} on {key[1][:12]}")
    for f in findings:
        s.found[f["kind"]] += 1
        hits = [k for k in instances if matches(f, k)]
        if not hits:
            what = f.get("cause", f.get("victim", ""))
            s.misses.append(f"{label}: false {f['kind']} on {f['node']}/{f['gpu']} {what}")
            continue
        s.precise[f["kind"]] += 1
        details = [span[5] for k in hits for span in instances[k]]
        if f["kind"] == "starved":
            s.cause_n += 1
            s.cause_ok += int(any(d.get("cause") == f["cause"] for d in details))
        if f["kind"] == "noisy_neighbor":
            s.aggressor_n += 1
            s.aggressor_ok += int(
                any(names.get(str(d["aggressor"])) == f["aggressor"] for d in details)
            )
    return s


def evaluate(path: str, days: float | None) -> Score:
    scenario = load(path)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "s.duckdb"
        simulate(scenario, store, days=days)
        horizon = days if days is not None else scenario.days
        doc = analyze([str(store)], since=f"{horizon}d")
        spans = truth(store)
    return score(doc, spans, tenants(path), scenario.name)


def straggler_oracle() -> str:
    root = data_root()
    if root is None:
        return "straggler oracle: ../shared/data not found, skipped"
    path = root / "alibaba-v2020-minibatch" / "job_1_norm.csv"
    rows = duckdb.sql(
        f"SELECT time, worker, batch_time_norm FROM read_csv('{path}') ORDER BY time, worker"
    ).fetchall()
    by: dict[int, dict[int, float]] = collections.defaultdict(dict)
    for t, w, v in rows:
        by[w][t] = v
    times = sorted({t for t, _, _ in rows})
    found = find_straggler({str(w): [by[w].get(t) for t in times] for w in sorted(by)})
    if found is None:
        return "straggler oracle (Alibaba PAI job 1): no straggler found (expected worker 6)"
    return (
        f"straggler oracle (Alibaba PAI job 1): worker {found.worker} from iteration "
        f"{times[found.start]} to {times[found.end - 1]}, {found.factor:.2f}x the median "
        "(expected: worker 6, from ~1811)"
    )


CADENCE = """
name = "ckpt"
start = "2026-11-16T00:00:00Z"
days = 1
interval_seconds = 60
seed = 5
[[nodes]]
name = "n1"
gpu = "H100-80GB"
gpus = 8
[[workloads]]
name = "llm"
kind = "training"
node = "n1"
gpus = "all"
[workloads.params]
checkpoint_every_minutes = {every}
checkpoint_minutes = 3
eval_every_minutes = 0
"""


def checkpoint_cadence(days: float) -> list[tuple[int, float, float, float]]:
    """(minutes between checkpoints, mean utilization, starved GPU-hours in findings, starved
    GPU-hours measured on every GPU below the thresholds too) per cadence."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for every in (15, 30, 60, 120):
            path = Path(tmp) / f"ckpt{every}.toml"
            path.write_text(CADENCE.replace("{every}", str(every)))
            store = Path(tmp) / f"ckpt{every}.duckdb"
            simulate(load(str(path)), store, days=days)
            doc = analyze([str(store)], since=f"{days}d")
            lost = sum(f["gpu_hours_lost"] for f in doc["findings"] if f["kind"] == "starved")
            measured = sum(g["starved_gpu_hours"] or 0.0 for g in doc["gpus"])
            con = duckdb.connect(str(store), read_only=True)
            row = con.execute("SELECT avg(utilization_gpu_ratio) FROM gpu_samples").fetchone()
            con.close()
            out.append((every, float(row[0]) if row else 0.0, lost, measured))
    return out


def report(title: str, s: Score) -> None:
    print(f"\n{title}")
    print(f"{'kind':<16}{'precision':>12}{'recall':>12}   (findings, truth instances)")
    for kind in KINDS:
        p = s.precise[kind] / s.found[kind] if s.found[kind] else float("nan")
        r = s.recalled[kind] / s.truths[kind] if s.truths[kind] else float("nan")
        print(f"{kind:<16}{p:>12.3f}{r:>12.3f}   ({s.found[kind]}, {s.truths[kind]})")
    if s.cause_n:
        print(f"starved cause right: {s.cause_ok}/{s.cause_n}")
    if s.aggressor_n:
        print(f"noisy aggressor right: {s.aggressor_ok}/{s.aggressor_n}")
    for miss in s.misses:
        print("  " + miss)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=None, help="simulate fewer days")
    parser.add_argument("--tuning", action="store_true", help="also score the built-in scenarios")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    held = Score()
    for path in sorted(HERE.glob("*.toml")):
        started = time.perf_counter()
        s = evaluate(str(path), args.days)
        print(f"{path.name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
        held.add(s)
    report("held-out scenarios (bench/heldout/)", held)
    if args.tuning:
        tuned = Score()
        for name in TUNING:
            tuned.add(evaluate(name, args.days))
        report("tuning scenarios (built-in)", tuned)
    print("\n" + straggler_oracle())
    print("\nthe independent set (bench/evalset.py: nvidia-smi captures no simulator made)")
    scores = evalset.evaluate()
    for line in evalset.report_lines(scores):
        print("  " + line)
    series = evalset.checkpoint_series(scores)
    print(
        "  checkpoint every 1/10/100/1000 steps: Spearman(true waiting, starved GPU-hours) "
        f"{series['spearman_gpu_hours']}, (true waiting, findings' GPU-hours) "
        f"{series['spearman_findings_hours']}"
    )
    print("\nstarved GPU-hours of one 8xH100 job by checkpoint cadence (1 day, 3-min stalls):")
    for every, util, lost, measured in checkpoint_cadence(1.0):
        print(
            f"  every {every:>3} min: utilization {util:.0%}, starved {lost:6.2f} GPU-h in "
            f"findings, {measured:6.2f} GPU-h measured (gpus[].starved_gpu_hours)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
