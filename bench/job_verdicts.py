"""``aiscope job`` verdicts against the simulator's ground truth, on scenarios the verdicts were
not written against (``bench/heldout/``; the verdict rules were written looking at the demo).

Each workload of a scenario becomes a job; its truth is the pathologies the simulator injected
into it (``ground_truth``). The verdict is right when its action names the injected pathology:
``starved`` with cause C -> ``starved_C`` (a straggler -> ``starved_communication``),
``idle_held`` -> ``release`` / ``release_idle`` / ``fewer_gpus``, a noisy-neighbour victim ->
``isolate``, throttling -> ``starved_throttled``; a workload with no pathology should get
``none``. "Listed" counts the truth anywhere among the job's changes.

    python bench/job_verdicts.py [--interval 300] [--days 1]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import tempfile
import time
from pathlib import Path

import duckdb
from findings import tenants  # bench/findings.py, beside this script

from analyzer.job import UnknownJob, job_summary
from sim.engine import simulate
from sim.scenario import load

HELDOUT = Path(__file__).resolve().parent / "heldout"
RELEASE = {"release", "release_idle", "fewer_gpus"}


def expected(pathology: str, detail: dict[str, object], workload: str) -> set[str] | None:
    """The verdict actions that name this pathology for ``workload``; ``None``: not its own."""
    if pathology == "starved":
        return {f"starved_{detail.get('cause', 'unknown')}"}
    if pathology == "straggler":
        return {"starved_communication"}
    if pathology == "throttled":
        return {"starved_throttled"}
    if pathology == "idle_held":
        return RELEASE
    if pathology == "noisy_neighbor":
        return {"isolate"} if detail.get("victim", workload) == workload else None
    return None


def truths(store: Path) -> dict[str, list[set[str]]]:
    con = duckdb.connect(str(store), read_only=True)
    rows = con.execute(
        "SELECT DISTINCT workload, pathology, detail FROM ground_truth WHERE workload != ''"
    ).fetchall()
    con.close()
    out: dict[str, list[set[str]]] = collections.defaultdict(list)
    for workload, pathology, detail in rows:
        out[workload]  # a workload with no pathology is a negative control
        if pathology:
            want = expected(pathology, json.loads(detail or "{}"), workload)
            if want and want not in out[workload]:
                out[workload].append(want)
    return out


def evaluate(path: Path, days: float | None, interval: float) -> collections.Counter[str]:
    scenario = dataclasses.replace(load(str(path)), interval_seconds=interval)
    names = tenants(str(path))
    score: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "s.duckdb"
        simulate(scenario, store, days=days)
        cache: dict[str, dict[str, object]] = {}
        for workload, wants in sorted(truths(store).items()):
            tenant = names.get(workload, "")
            try:
                doc = job_summary([str(store)], tenant, analyses=cache)  # type: ignore[arg-type]
            except UnknownJob:
                continue  # a workload with no process of its own (outside any job)
            action = str(doc["verdict"]["action"])
            listed = {str(c["action"]) for c in doc["changes"]}
            label = f"{path.stem}: {workload} ({tenant})"
            if not wants:
                score["healthy"] += 1
                score["healthy_none"] += action == "none"
                if action != "none":
                    print(f"  {label}: healthy, verdict {action}: {doc['verdict']['summary']}")
                continue
            score["sick"] += 1
            hit = any(action in w for w in wants)
            score["sick_verdict"] += hit
            score["sick_listed"] += all(w & listed for w in wants)
            if not hit:
                print(f"  {label}: truth {sorted(set().union(*wants))}, verdict {action}")
    return score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=None, help="simulate fewer days")
    parser.add_argument("--interval", type=float, default=300.0, help="seconds between samples")
    args = parser.parse_args()
    for name in ("agent", "store"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    total: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    for path in sorted(HELDOUT.glob("*.toml")):
        total.update(evaluate(path, args.days, args.interval))
    print(
        f"pathological jobs: verdict names the truth {total['sick_verdict']}/{total['sick']}, "
        f"truth among the changes {total['sick_listed']}/{total['sick']}; healthy jobs with no "
        f"change: {total['healthy_none']}/{total['healthy']} "
        f"({time.monotonic() - started:.0f} s)"
    )


if __name__ == "__main__":
    main()
