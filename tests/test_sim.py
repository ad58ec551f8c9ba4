"""Virtual hardware: realism that matters, pinned as numbers; determinism; ground truth; faults."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from sim.engine import build_workloads, simulate
from sim.scenario import ScenarioError, load
from sim.workloads import Inference
from tests.conftest import REPO


def _pearson(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    vx = sum((x - mx) ** 2 for x in xs)
    vy = sum((y - my) ** 2 for y in ys)
    return cov / math.sqrt(vx * vy)


def _diff(xs: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(xs)]


@pytest.fixture(scope="module")
def training_store(training_multinode_store: Path) -> Path:
    return training_multinode_store


@pytest.fixture(scope="module")
def inference_store(inference_day_store: Path) -> Path:
    return inference_day_store


def _series(path: Path, sql: str, params: list[object]) -> dict[object, list[float]]:
    con = duckdb.connect(str(path), read_only=True)
    rows = con.execute(sql, params).fetchall()
    con.close()
    out: dict[object, list[float]] = {}
    for key, value in rows:
        out.setdefault(key, []).append(value)
    return out


def test_training_ranks_move_in_lockstep_across_nodes(training_store: Path) -> None:
    power = _series(
        training_store,
        "SELECT node || '/' || gpu_index, power_watts FROM gpu_samples "
        "WHERE node IN ('gpu-node-01', 'gpu-node-02') "
        "AND ts >= (SELECT min(ts) + 900 FROM gpu_samples) "
        "ORDER BY node, gpu_index, ts",
        [],
    )
    keys = sorted(power)
    assert len(keys) == 16
    a = _diff(power[keys[0]])
    for other in (keys[1], keys[9], keys[15]):  # same node and the other node
        assert _pearson(a, _diff(power[other])) >= 0.8, other


def test_inference_replicas_do_not_move_together(inference_store: Path) -> None:
    util = _series(
        inference_store,
        "SELECT gpu_index, utilization_gpu_ratio FROM gpu_samples WHERE gpu_index IN (0, 1, 2, 4) "
        "ORDER BY gpu_index, ts",
        [],
    )
    # GPUs 0 and 1 are one tensor-parallel replica (lockstep); 2 and 4 are other replicas.
    assert _pearson(_diff(util[0]), _diff(util[1])) >= 0.9
    assert abs(_pearson(_diff(util[0]), _diff(util[2]))) < 0.3
    assert abs(_pearson(_diff(util[0]), _diff(util[4]))) < 0.3


def test_inference_utilization_follows_its_request_rate(inference_store: Path) -> None:
    scenario = load("inference-diurnal")
    chat = next(w for w in build_workloads(scenario, scenario.seed) if w.name == "chat-api")
    assert isinstance(chat, Inference)
    util = _series(
        inference_store,
        "SELECT gpu_index, utilization_gpu_ratio FROM gpu_samples WHERE gpu_index = 0 ORDER BY ts",
        [],
    )[0]
    con = duckdb.connect(str(inference_store), read_only=True)
    stamps = [
        r[0]
        for r in con.execute(
            "SELECT ts FROM gpu_samples WHERE gpu_index = 0 ORDER BY ts"
        ).fetchall()
    ]
    con.close()
    # Requests per second reaching replica 0, averaged over each sample's minute.
    rate = [
        statistics.fmean(chat.request_rate(ts - scenario.start_epoch - s, 0) for s in range(60))
        for ts in stamps
    ]
    warm = int(chat.p.startup_minutes) + 1
    assert _pearson(util[warm:], rate[warm:]) >= 0.8


def test_collective_waits_read_busy_at_low_power(training_store: Path) -> None:
    # While rank 0 writes a checkpoint (its utilization drops), the other 15 ranks wait in a
    # collective: their utilization still reads ~100%, their power and SM activity collapse.
    con = duckdb.connect(str(training_store), read_only=True)
    rows = con.execute(
        "WITH r0 AS (SELECT ts FROM gpu_samples WHERE node = 'gpu-node-01' AND gpu_index = 0 "
        "AND utilization_gpu_ratio < 0.1 AND ts > (SELECT min(ts) + 900 FROM gpu_samples)) "
        "SELECT s.utilization_gpu_ratio, s.power_watts / d.power_limit_watts, s.sm_active_ratio "
        "FROM gpu_samples s JOIN r0 USING (ts) JOIN devices d USING (node, uuid) "
        "WHERE s.node IN ('gpu-node-01', 'gpu-node-02') AND NOT (s.node = 'gpu-node-01' "
        "AND s.gpu_index = 0)"
    ).fetchall()
    steady = con.execute(
        "SELECT avg(power_watts) / 700, avg(utilization_gpu_ratio) FROM gpu_samples "
        "WHERE node = 'gpu-node-02' AND utilization_gpu_ratio > 0.9"
    ).fetchone()
    con.close()
    assert len(rows) >= 15 * 10  # several checkpoints in 6 hours
    waiting = [r for r in rows if r[0] >= 0.9 and r[1] <= 0.3 and r[2] < 0.1]
    assert len(waiting) / len(rows) >= 0.9
    assert steady[0] > 0.6  # outside checkpoints the same ranks draw most of their limit


def test_preallocated_inference_memory_sits_at_090(inference_store: Path) -> None:
    con = duckdb.connect(str(inference_store), read_only=True)
    ratios = con.execute(
        "SELECT s.memory_used_bytes / d.memory_total_bytes FROM gpu_samples s "
        "JOIN devices d USING (node, uuid) WHERE s.gpu_index < 6 "
        "AND s.ts > (SELECT min(ts) + 600 FROM gpu_samples)"
    ).fetchall()
    growing = con.execute(
        "SELECT min(memory_used_bytes), max(memory_used_bytes) FROM gpu_samples "
        "WHERE gpu_index = 7 AND ts > (SELECT min(ts) + 600 FROM gpu_samples)"
    ).fetchone()
    con.close()
    assert all(abs(r - 0.90) < 0.005 for (r,) in ratios)
    assert growing[1] > growing[0] * 1.2  # weights plus a KV cache that grows with load


def test_ground_truth_covers_every_gpu_and_the_pathologies(training_store: Path) -> None:
    con = duckdb.connect(str(training_store), read_only=True)
    classes = dict(
        con.execute(
            "SELECT truth_class, count(DISTINCT uuid) FROM ground_truth WHERE pathology IS NULL "
            "GROUP BY 1"
        ).fetchall()
    )
    pathologies = con.execute(
        "SELECT pathology, workload, detail FROM ground_truth WHERE pathology IS NOT NULL"
    ).fetchall()
    gpus = con.execute("SELECT count(DISTINCT uuid) FROM gpu_samples").fetchone()[0]
    covered = con.execute("SELECT count(DISTINCT uuid) FROM ground_truth").fetchone()[0]
    con.close()
    assert covered == gpus == 20
    assert classes["training"] >= 18 and classes["idle"] >= 1
    kinds = {(p, w) for p, w, _ in pathologies}
    assert ("straggler", "pretrain-70b") in kinds
    assert ("starved", "pretrain-70b") in kinds  # the other ranks wait on the straggler
    assert ("idle_held", "held-crashed-job") in kinds
    throttled = [json.loads(d) for p, w, d in pathologies if w == "ft-hot"]
    assert throttled and throttled[0]["cause"] == "throttled"


def test_simulation_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    scenario = load("noisy-timeslice")
    digests = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        path = tmp_path / f"{name}.duckdb"
        simulate(scenario, path, days=0.05, seed=seed)
        con = duckdb.connect(str(path), read_only=True)
        digests.append(
            con.execute(
                "SELECT sum(hash(ts, uuid, utilization_gpu_ratio, power_watts, memory_used_bytes)) "
                "FROM gpu_samples"
            ).fetchone()[0]
        )
        con.close()
    assert digests[0] == digests[1] != digests[2]


def test_noisy_timeslice_truth_separates_contention_from_consolidation(tmp_path: Path) -> None:
    path = tmp_path / "n.duckdb"
    simulate(load("noisy-timeslice"), path, days=1.0)
    con = duckdb.connect(str(path), read_only=True)
    noisy = con.execute(
        "SELECT DISTINCT gpu_index, workload FROM ground_truth WHERE pathology = 'noisy_neighbor'"
    ).fetchall()
    shared = con.execute(
        "SELECT max(n) FROM (SELECT ts, uuid, count(*) n FROM process_samples GROUP BY ts, uuid)"
    ).fetchone()[0]
    con.close()
    assert {w for _, w in noisy} == {"ft-a", "ft-b"}
    assert {g for g, _ in noisy} == {0, 1}  # the quiet notebooks on GPU 2 are consolidation
    assert shared == 2


def test_faults_on_a_schedule(tmp_path: Path) -> None:
    scenario = tmp_path / "faults.toml"
    scenario.write_text(
        'name = "faults"\ndays = 0.1\ninterval_seconds = 60\n'
        '[[nodes]]\nname = "n1"\ngpu = "L4"\ngpus = 2\n'
        '[[workloads]]\nname = "svc"\nkind = "inference"\nnode = "n1"\ngpus = [0, 1]\n'
        '[[faults]]\nnode = "n1"\ngpu = 1\nkind = "lost"\nat_hours = 0.5\nduration_hours = 0.5\n'
        '[[faults]]\nnode = "n1"\ngpu = 0\nkind = "xid"\nat_hours = 1.0\nxid = 79\n'
    )
    path = tmp_path / "f.duckdb"
    simulate(load(str(scenario)), path)
    con = duckdb.connect(str(path), read_only=True)
    events = con.execute("SELECT kind, code FROM agent_events ORDER BY ts").fetchall()
    down = con.execute(
        "SELECT count(*) FROM gpu_samples WHERE gpu_index = 1 AND NOT up"
    ).fetchone()[0]
    con.close()
    assert ("gpu_lost", None) in events and ("gpu_recovered", None) in events
    assert ("xid", 79) in events
    assert 20 <= down <= 40  # 30 minutes lost, retried with backoff


NODE = '[[nodes]]\nname = "n"\ngpu = "L4"\n'
TRAINING = NODE + '[[workloads]]\nname = "w"\nkind = "training"\nnode = "n"\ngpus = [0]\n'


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[[nodes]]\nname = "n"\ngpu = "B300"\n', "unknown GPU model 'B300'"),
        (NODE + '[[workloads]]\nname = "w"\nkind = "mining"\n', "unknown workload kind"),
        (NODE + '[[workloads]]\nname = "w"\nkind = "training"\nnode = "m"\n', "unknown node 'm'"),
        (TRAINING + "[workloads.params]\nstep_secs = 1\n", "unknown parameter 'step_secs'"),
        (TRAINING + '[workloads.params]\nstep_seconds = "fast"\n', "step_seconds must be float"),
        ("nodes = [", "not valid TOML"),
    ],
)
def test_bad_scenarios_are_refused_with_the_key(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=r"bad\.toml") as info:
        load(str(path))
    assert needle in str(info.value)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiscope",
            "simulate",
            str(path),
            "--store",
            str(tmp_path / "s.duckdb"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("aiscope: ") and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s.duckdb").exists()


def test_an_unmodified_nvml_consumer_sees_the_virtual_gpus() -> None:
    # Not importorskip: importing gpustat here would patch pynvml's functions in this process
    # (gpustat wraps nvmlDeviceGetMemoryInfo) and break the tests that run after this one.
    if importlib.util.find_spec("gpustat") is None:
        pytest.skip("gpustat not installed")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim.run_with",
            "demo",
            "--node",
            "gpu-node-03",
            "--at-hours",
            "14",
            "--",
            "gpustat",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    gpus = json.loads(result.stdout)["gpus"]
    assert len(gpus) == 8
    assert {g["name"] for g in gpus} == {"NVIDIA A100-SXM4-80GB"}
    assert all(g["memory.total"] == 81920 for g in gpus)
    assert all(g["enforced.power.limit"] == 400 for g in gpus)
    # chat-api (GPUs 0-3) serves at 14:00; GPUs 5-6 are batch-only at night; 7 is a notebook.
    assert all(g["utilization.gpu"] > 10 for g in gpus[:4])
    assert abs(gpus[0]["memory.used"] / 81920 - 0.90) < 0.02
    assert gpus[5]["memory.used"] == 0 and gpus[7]["memory.used"] > 20000


def test_a_builtin_name_wins_over_a_directory_of_that_name(tmp_path, monkeypatch) -> None:
    """`aiscope demo` run in a directory that has a `demo/` folder still finds the scenario."""
    (tmp_path / "demo").mkdir()
    monkeypatch.chdir(tmp_path)
    assert load("demo").name


def test_the_scenario_fixtures_link_resolves() -> None:
    """fixtures/scenarios is the README's and `simulate --help`'s path to the built-ins."""
    from tests.conftest import FIXTURES

    assert (FIXTURES / "scenarios" / "demo.toml").is_file()
