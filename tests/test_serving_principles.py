"""The behaviour-only principles of issue #23 (production serving is not a notebook), one test
each, on hand-built stores in the shapes that broke the classifier (each failed before the
change), with the negative control beside it:

1. replicas: GPUs across nodes with footprints within 1% whose load moves together over
   15-minute means but not minute by minute are one service (inference); notebooks are
   singletons; training ranks in lockstep stay training;
2. quiet hours are not sessions: runs of minutes at partial duty over most hours of the day are
   requests, however long the nights;
3. decode-bound generation: saturated utilization at a third of the power limit on a KV-cache
   reservation is generation (batch), not training;
4. short windows are honest: under two days, between inference and interactive, confidence is
   at most 0.6 unless replicas decide.

The serving shapes come from `bench/evalset.py`'s generator, held there to the issue's published
figures (`tests/test_evalset.py`), not from the classifier's thresholds.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.store import Store
from analyzer.analysis import analyze
from bench.evalset import Proc, notebook, quiet_service, train
from store.schema import Device, GpuSample

T0 = 1_764_028_800.0  # a midnight, UTC
GIB = 1 << 30
DAY = 86400


def _store(path: Path, nodes: Sequence[Sequence[Proc]], device: dict[str, Any] | None) -> Path:
    """One GPU per timeline, ``nodes`` of them per node; a timeline's tick is its sample
    period (utilization = its duty, memory in MiB, power from its intensity when ``device``
    gives a limit)."""
    store = Store(path)
    records: list[object] = []
    for n, procs in enumerate(nodes):
        for i, p in enumerate(procs):
            uuid = f"GPU-{n}-{i}"
            if device is not None:
                records.append(Device(f"n{n}", uuid, i, last_seen_ts=T0, **device))
            for k in range(len(p.util)):
                fields: dict[str, Any] = {
                    "utilization_gpu_ratio": round(p.util[k] / 100, 2),
                    "memory_used_bytes": int(p.mem[k] * (1 << 20)),
                }
                if device is not None:
                    watts = 70 + 630 * p.busy[k] * p.inten[k]
                    fields["power_watts"] = round(watts, 1)
                records.append(GpuSample(T0 + k * p.res, f"n{n}", uuid, i, True, **fields))
    store.add(records)
    store.flush()
    store.close()
    return path


def _h100() -> dict[str, Any]:
    return {
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": None,
        "memory_total_bytes": 80 * GIB,
        "power_limit_watts": 700.0,
        "mig_mode": None,
        "driver_version": None,
        "nvlink_count": None,
    }


def _gpus(path: Path) -> list[dict[str, Any]]:
    return list(analyze([str(path)], since="30d")["gpus"])


def _minutes(p: Proc) -> Proc:
    """A 1-second timeline as a 1-minute capture (duty averaged, memory at the minute's end)."""
    n = len(p.util) // 60
    util = [sum(p.util[i * 60 : (i + 1) * 60]) / 60 for i in range(n)]
    return Proc(
        60.0, [u / 100 for u in util], [1.0] * n, util, [p.mem[i * 60 + 59] for i in range(n)]
    )


# 1 -----------------------------------------------------------------------------------------------


def test_replicas_across_nodes_are_one_service(tmp_path: Path) -> None:
    """Eight replicas of a quiet serving service, four on each of two nodes, one day at one
    minute, utilization and memory only: the notebook evidence (hours-long quiet stretches)
    used to win; replicas decide now, with more than the short-window cap."""
    pods = quiet_service(1, random.Random(23), pods=8, mem_mib=22.8 * 1024, tz_hours=8.0)
    gpus = _gpus(_store(tmp_path / "s.duckdb", [pods[:4], pods[4:]], None))
    assert [g["class"] for g in gpus] == ["inference"] * 8
    assert all(g["basis"].startswith("inference:replica_group:") for g in gpus)
    assert all(g["confidence"] > 0.6 for g in gpus)
    assert any("replicas of one service" in e for e in gpus[0]["evidence"])


def test_notebooks_are_singletons(tmp_path: Path) -> None:
    """The negative control: notebooks on one node over the same day, each with its own
    footprint and timing, stay interactive and get no replica evidence."""
    rng = random.Random(5)
    books = [_minutes(notebook(DAY, rng, mem=m * 1024)) for m in (9.0, 14.5, 22.0, 27.5)]
    gpus = _gpus(_store(tmp_path / "s.duckdb", [books], None))
    assert [g["class"] for g in gpus] == ["interactive"] * 4
    assert not any("replicas of one service" in e for g in gpus for e in g["evidence"])


def test_training_ranks_in_lockstep_are_not_replicas(tmp_path: Path) -> None:
    """Ranks of one job share a footprint and move together at every resolution: training."""
    rng = random.Random(9)
    job = train(DAY // 60, rng, mem=70000, jitter=[1.0], res=60.0, ckpt=(2700, 180, 0))
    gpus = _gpus(_store(tmp_path / "s.duckdb", [[job] * 4], _h100()))
    assert [g["class"] for g in gpus] == ["training"] * 4
    assert not any(g["basis"].startswith("inference:replica_group") for g in gpus)


# 2 -----------------------------------------------------------------------------------------------


def test_quiet_hours_of_a_single_replica_are_not_sessions(tmp_path: Path) -> None:
    """One replica alone (no peers to decide), three days: runs of minutes at partial duty
    through most hours, nights over ten times quieter: inference, not a notebook."""
    pod = quiet_service(3, random.Random(31), pods=1, mem_mib=23.1 * 1024)[0]
    (g,) = _gpus(_store(tmp_path / "s.duckdb", [[pod]], None))
    assert g["class"] == "inference"
    assert g["basis"].startswith("inference:quiet_hours:")
    assert any("requests, not sessions" in e for e in g["evidence"])


def test_a_notebook_over_three_days_is_still_interactive(tmp_path: Path) -> None:
    """The negative control: cells that run kernels back to back in working hours."""
    book = _minutes(notebook(3 * DAY, random.Random(8), mem=12 * 1024))
    (g,) = _gpus(_store(tmp_path / "s.duckdb", [[book]], None))
    assert g["class"] == "interactive"
    assert not any("requests, not sessions" in e for e in g["evidence"])


# 3 -----------------------------------------------------------------------------------------------


def _generation(power_intensity: float, ticks: int = 1440) -> Proc:
    """Saturated utilization on a 0.9 reservation, one tick per 5 s."""
    mem = 0.9 * 80 * 1024
    return Proc(5.0, [1.0] * ticks, [power_intensity] * ticks, [100.0] * ticks, [mem] * ticks)


def test_decode_bound_generation_is_not_training(tmp_path: Path) -> None:
    """Two hours at 100% utilization drawing ~30% of the limit (decode is memory-bound): the
    low power read as ranks waiting in collectives, and the run was called training."""
    (g,) = _gpus(_store(tmp_path / "s.duckdb", [[_generation(0.22)]], _h100()))
    assert g["class"] == "batch"
    assert g["basis"].startswith("batch:decode:")
    assert any("memory-bound decode" in e for e in g["evidence"])


def test_saturation_near_the_power_limit_is_not_decode(tmp_path: Path) -> None:
    """The control: the same run at ~90% of the limit (matmuls) gets no decode evidence."""
    (g,) = _gpus(_store(tmp_path / "s.duckdb", [[_generation(0.9)]], _h100()))
    assert not any("memory-bound decode" in e for e in g["evidence"])


# 4 -----------------------------------------------------------------------------------------------


def test_a_short_window_between_serving_and_a_session_is_at_most_0_6(tmp_path: Path) -> None:
    """One quiet replica for a day: no daily structure and no replicas to decide."""
    pod = quiet_service(1, random.Random(41), pods=1, mem_mib=22.0 * 1024)[0]
    (g,) = _gpus(_store(tmp_path / "s.duckdb", [[pod]], None))
    assert g["class"] in ("inference", "interactive")
    assert g["confidence"] <= 0.6
    assert any("no daily structure shows" in e for e in g["evidence"])
