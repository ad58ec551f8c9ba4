"""Noisy neighbours that start together (issue #23, 5), on stores built by bench/neighbors.py's
sharing model (a time-slicer's max-min fair shares) and by hand: the workload's solo level on
the same GPU model elsewhere measures a co-started victim; with none, the slowdown is null;
side-by-side pairs and an unharmed light tenant are not findings; anti-correlation is claimed
only when the correlation says so."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from agent.store import Store
from analyzer.analysis import analyze
from bench import neighbors as nb
from sim.traces import data_root
from store.schema import Device, GpuSample, Process, ProcessSample

#: Workloads in Gavel's shape (the real list is read from ../shared/data when present).
JOBS = [
    nb.Job(gpu, model, batch)
    for gpu in ("v100", "p100")
    for model in ("ResNet-18", "ResNet-50", "LM")
    for batch in (16, 32, 64, 128)
]


def _noisy(fleet: nb.Fleet, tmp_path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    path = tmp_path / "s.duckdb"
    store = Store(path)
    store.add(fleet.records)
    store.flush()
    store.close()
    doc = analyze([str(path)], since="1d")
    return {(f["uuid"], f["victim"]): f for f in doc["findings"] if f["kind"] == "noisy_neighbor"}


def test_max_min_shares_give_a_light_tenant_all_it_asks_for() -> None:
    assert nb.max_min_shares([0.2, 1.0]) == pytest.approx([0.2, 0.8])
    assert nb.max_min_shares([0.9, 0.8]) == pytest.approx([0.5, 0.5])
    assert nb.max_min_shares([0.3, 0.4]) == pytest.approx([0.3, 0.4])  # they fit: no one waits
    assert nb.max_min_shares([0.1, 0.7, 0.7]) == pytest.approx([0.1, 0.45, 0.45])


def test_co_started_twins_are_measured_against_their_workloads_solo_runs(tmp_path: Path) -> None:
    fleet = nb.Fleet(random.Random(5))
    jobs = nb.pair_of(fleet, JOBS)
    nb.co_started(fleet, "twin", jobs, (0.9, 0.8), (True, True))
    found = _noisy(fleet, tmp_path)
    assert len(fleet.truths) == 2
    for t in fleet.truths:
        f = found[(t.uuid, t.tenant)]
        assert f["slowdown_ratio"] == pytest.approx(t.slowdown, abs=0.10)
        assert any("the same workload" in e and "ran alone" in e for e in f["evidence"])


def test_co_started_tenants_never_solo_anywhere_get_a_null_slowdown(tmp_path: Path) -> None:
    fleet = nb.Fleet(random.Random(6))
    nb.never_solo(fleet, JOBS)  # with decoys: another batch size, and another GPU model
    found = _noisy(fleet, tmp_path)
    for t in fleet.truths:
        f = found[(t.uuid, t.tenant)]
        assert f["slowdown_ratio"] is None
        assert any("never ran alone" in e for e in f["evidence"])


def test_side_by_side_pairs_and_an_unharmed_light_tenant_are_not_findings(tmp_path: Path) -> None:
    fleet = nb.Fleet(random.Random(7))
    nb.co_started(fleet, "fits", nb.pair_of(fleet, JOBS), (0.3, 0.35), (True, True))
    nb.co_started(fleet, "fits", nb.pair_of(fleet, JOBS), (0.25, 0.4), (False, False))
    nb.co_started(fleet, "unharmed", nb.pair_of(fleet, JOBS), (0.25, 0.98), (True, True))
    nb.co_started(fleet, "unharmed", nb.pair_of(fleet, JOBS), (0.22, 0.97), (False, False))
    found = _noisy(fleet, tmp_path)
    light = [t for t in fleet.truths if t.shape == "unharmed" and t.slowdown < 0.05]
    greedy = [t for t in fleet.truths if t.shape == "unharmed" and t.victim]
    assert len(light) == len(greedy) == 2
    assert set(found) == {(t.uuid, t.tenant) for t in greedy}
    measured, unknown = sorted(greedy, key=lambda t: not t.measurable)
    assert found[(measured.uuid, measured.tenant)]["slowdown_ratio"] == pytest.approx(
        measured.slowdown, abs=0.10
    )
    assert found[(unknown.uuid, unknown.tenant)]["slowdown_ratio"] is None


def test_no_anticorrelation_is_claimed_without_a_clear_one(tmp_path: Path) -> None:
    """Two tenants each at ~45% of a saturated GPU with independent noise (r near 0): A's
    workload ran alone at 90% on GPU 1, so A is slowed by half; nothing says they traded
    slices, and the evidence must not say so."""
    rng = random.Random(3)
    path = tmp_path / "s.duckdb"
    store = Store(path)
    records: list[object] = [
        Device("n1", f"GPU-{i}", i, "Tesla V100-SXM2-16GB", None, 16 << 30, 300.0, None, None,
               None, nb.T0)
        for i in (0, 1)
    ]  # fmt: skip
    runs = [(10, "901", "python a.py --seed 1"), (20, "902", "python b.py"),
            (30, "903", "python a.py --seed 2")]  # fmt: skip
    for pid, job, cmd in runs:
        cgroup = f"/slurm/uid_1000/job_{job}/step_0"
        records.append(
            Process("n1", pid, None, "python", cmd, "u", cgroup, job, None, None, None, nb.T0,
                    nb.T0 + 12 * 3600)
        )  # fmt: skip
    for m in range(4 * 60):
        ts = nb.T0 + m * 60
        records.append(GpuSample(ts, "n1", "GPU-1", 1, True, 0.9, None, 4 << 30))
        records.append(ProcessSample(ts, "n1", "GPU-1", 30, None, 4 << 30, rng.gauss(0.9, 0.02)))
        ts += 6 * 3600
        records.append(GpuSample(ts, "n1", "GPU-0", 0, True, 1.0, None, 8 << 30))
        for pid in (10, 20):
            share = rng.gauss(0.45, 0.03)
            records.append(ProcessSample(ts, "n1", "GPU-0", pid, None, 4 << 30, share))
    store.add(records)
    store.flush()
    store.close()
    doc = analyze([str(path)], since="1d")
    noisy = {f["victim"]: f for f in doc["findings"] if f["kind"] == "noisy_neighbor"}
    a = noisy["slurm job 901"]
    assert a["slowdown_ratio"] == pytest.approx(0.5, abs=0.03)
    assert abs(a["correlation"]) < 0.361
    assert not any("moved against" in e for e in a["evidence"])


@pytest.mark.skipif(data_root() is None, reason="../shared/data not found")
def test_held_out_seed_on_gavels_workloads_meets_the_targets() -> None:
    """One held-out seed of the bench (never looked at while tuning): precision and recall of
    at least 0.9, every magnitude within 0.10 where a reference exists, null where none does."""
    s = nb.evaluate(101, nb.gavel_jobs())
    assert s.victims >= 20
    assert s.precise / s.findings >= 0.9
    assert s.recalled / s.victims >= 0.9
    assert s.within == s.measured > 0
    assert s.null_right == s.nulls > 0
    assert all(r <= -0.361 for r in s.claims)
