"""``aiscope job``: one workload's summary, read from the same analysis ``analyze`` reports."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, run_aiscope

from aiscope.slurm import decode, encode
from analyzer.analysis import analyze
from analyzer.job import UnknownJob, find_job, job_summary
from analyzer.load import Holding, Holdings
from report.job import render_job

JOBS = [
    "41000",
    "41006",
    "41007",
    "41008",
    "41009",
    "jupyter-user5.service",
    "chat-prod/chat-api",
]


@pytest.fixture(scope="module")
def analysis(demo_two_day_store: Path) -> dict[str, Any]:
    return analyze([str(demo_two_day_store)], "7d")


@pytest.fixture(scope="module")
def summaries(demo_two_day_store: Path) -> dict[str, dict[str, Any]]:
    shared: dict[str, dict[str, Any]] = {}  # one analysis for every job of the store
    return {j: job_summary([str(demo_two_day_store)], j, analyses=shared) for j in JOBS}


def _names(f: dict[str, Any]) -> set[str]:
    return {str(f[k]) for k in ("job", "holder", "victim", "aggressor") if f.get(k)}


@pytest.mark.parametrize("job", JOBS)
def test_findings_are_analyzes_findings_for_the_job(
    job: str, analysis: dict[str, Any], summaries: dict[str, dict[str, Any]]
) -> None:
    doc = summaries[job]
    uuids = {g["uuid"] for g in doc["gpus"]}
    name = doc["job"]["name"]
    expected = [
        {k: v for k, v in f.items() if k != "series"}
        for f in analysis["findings"]
        if f["uuid"] in uuids and name in _names(f)
    ]
    assert doc["findings"] == expected
    assert doc["analysis"]["window"] == analysis["window"]


def test_each_demo_job_gets_the_verdict_its_evidence_supports(
    summaries: dict[str, dict[str, Any]],
) -> None:
    verdict = {j: d["verdict"] for j, d in summaries.items()}
    # the CPU-starved fine-tune: input-bound, with its measured share and the fix
    assert verdict["41006"]["action"] == "starved_input_cpu"
    assert "waiting on CPU" in verdict["41006"]["summary"]
    assert "DataLoader workers" in verdict["41006"]["summary"]
    # the 16-GPU run waits in collectives behind a straggler
    assert verdict["41000"]["action"] == "starved_communication"
    stragglers = {f.get("straggler") for f in summaries["41000"]["findings"]} - {None}
    assert all(f"straggler {s}" in verdict["41000"]["summary"] for s in stragglers)
    # the time-sliced pair: the measured victim gets exclusive GPUs and its slowdown; the other,
    # never seen alone, is not called healthy: the sharing is named, unmeasured
    assert verdict["41007"]["action"] == "isolate"
    assert "slower while slurm job 41008 shared its gpu" in verdict["41007"]["summary"]
    assert verdict["41008"]["action"] == "isolate"
    assert "could not be measured" in verdict["41008"]["summary"]
    # a serving pod at low traffic with its memory pre-allocated: nothing to change
    assert verdict["chat-prod/chat-api"]["action"] == "none"
    assert summaries["chat-prod/chat-api"]["class"]["class"] == "inference"
    # the job that holds a GPU and never computes, and the notebook unit idle between sessions
    assert verdict["41009"]["action"] in ("release_idle", "release")
    assert verdict["jupyter-user5.service"]["action"] == "release_idle"
    assert "notebook" in verdict["jupyter-user5.service"]["summary"]
    for doc in summaries.values():
        assert doc["verdict"]["gpu_hours"] <= doc["gpu_hours"] + 1e-6


def test_per_gpu_figures_are_physical(summaries: dict[str, dict[str, Any]]) -> None:
    doc = summaries["41006"]
    assert doc["schema"] == "aiscope.job/1"
    assert doc["nodes"] == ["gpu-node-04"]
    assert [g["gpu"] for g in doc["gpus"]] == [0, 1, 2, 3]
    for g in doc["gpus"]:
        assert g["memory_peak_bytes"] <= g["memory_total_bytes"]
        assert 0.0 < g["power_ratio"] <= 1.0
        assert 0.0 < g["utilization"] <= 1.0
        assert g["ran_kernels"] is True
        assert g["waiting_ratio"] and g["waiting_ratio"] > 0.1
    assert doc["waiting"]["cause"] == "input_cpu"
    idle = summaries["41009"]["gpus"][0]
    assert idle["ran_kernels"] is False and idle["class"] == "interactive"


def test_a_job_running_at_the_newest_sample_is_running_and_one_that_ended_is_not(
    summaries: dict[str, dict[str, Any]], demo_two_day_store: Path
) -> None:
    assert summaries["41000"]["state"] == "running"
    for doc in summaries.values():  # ended: not seen in its node's newest process scan
        if doc["state"] == "ended":
            assert doc["window"]["end"] < doc["analysis"]["window"]["end"]
    ended = job_summary([str(demo_two_day_store)], "41000", ended=True)
    assert ended["state"] == "ended"
    assert "so far" in render_job(summaries["41000"])


def test_allocated_gpus_it_never_touched_are_named(demo_two_day_store: Path) -> None:
    doc = job_summary(
        [str(demo_two_day_store)], "41006", allocated=("gpu-node-04", (0, 1, 2, 3, 7))
    )
    assert len(doc["gpus"]) == 5
    unused = [c for c in doc["changes"] if c["action"] == "fewer_gpus"]
    assert unused and unused[0]["summary"].startswith("ask for 4 GPUs, not 5: 1 never ran")


def test_cli_text_json_and_unknown_job(demo_two_day_store: Path) -> None:
    store = str(demo_two_day_store)
    text = run_aiscope("job", "41006", "--store", store)
    assert text.returncode == 0, text.stderr
    assert "Verdict: input-bound" in text.stdout
    assert "gpu-node-04/3" in text.stdout
    as_json = run_aiscope("job", "41007", "--store", store, "--format", "json")
    assert json.loads(as_json.stdout)["verdict"]["action"] == "isolate"
    unknown = run_aiscope("job", "41011", "--store", store, env={"PATH": "/nonexistent"})
    assert unknown.returncode == 2
    assert unknown.stdout == ""
    line = unknown.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("aiscope: job 41011")
    assert "nearest known: 41009, 41008" in line


def test_admin_comment_round_trip(summaries: dict[str, dict[str, Any]]) -> None:
    doc = summaries["41000"]
    comment = encode(doc)
    assert comment.startswith("aiscope32:") and len(comment) < 16000
    assert decode(f"other notes {comment}", "41000") == doc
    # sacctmgr (Slurm 22.05) lowercases what it stores: base32 survives it
    assert decode(comment.lower(), "41000") == doc
    # what earlier epilogs stored, base64 through scontrol, still reads
    legacy = "aiscope:" + base64.b64encode(gzip.compress(json.dumps(doc).encode())).decode()
    assert decode(legacy, "41000") == doc


def _holding(tenant: str, **ids: Any) -> Holding:
    base: dict[str, Any] = {
        "slurm_job_id": None,
        "pod_uid": None,
        "pod_namespace": None,
        "pod_name": None,
        "systemd_unit": None,
        "user": "ann",
        "node": "n1",
        "uuid": "GPU-1",
        "first_ts": 0.0,
        "last_ts": 3600.0,
        "memory_max_bytes": None,
    }
    return Holding(tenant, **{**base, **ids})


def test_a_workload_is_found_by_every_id_it_has() -> None:
    found = Holdings(
        (
            _holding("pod ml/llm-0", pod_uid="3f2a-uid", pod_namespace="ml", pod_name="llm-0"),
            _holding("unit jupyter-ann.service", systemd_unit="jupyter-ann.service"),
            _holding("slurm job 1234_7", slurm_job_id="1234_7"),
        ),
        3600.0,
        {},
    )
    for name in ("ml/llm-0", "3f2a-uid", "pod ml/llm-0"):
        assert find_job(found, name).kind == "pod"
    for name in ("jupyter-ann.service", "jupyter-ann"):
        assert find_job(found, name).ids["systemd_unit"] == "jupyter-ann.service"
    assert find_job(found, "1234_7").kind == "slurm"
    with pytest.raises(UnknownJob) as err:
        find_job(found, "ml/llm-1")
    assert err.value.nearest[0] == "ml/llm-0"
    assert err.value.exit_code == 2


def test_with_prices_the_job_and_its_verdict_have_a_cost_and_an_owner(
    demo_two_day_store: Path,
) -> None:
    from analyzer.prices import from_file

    accounting = from_file(REPO / "aiscope" / "demo-config.toml")
    doc = job_summary([str(demo_two_day_store)], "41006", accounting=accounting)
    assert doc["job"]["owner"] == "llm"  # [owners.accounts] llm = [..., "wei"]
    assert doc["currency"] == "USD"
    # 4 H100 at 4.00 per GPU-hour
    assert doc["cost"] == pytest.approx(doc["gpu_hours"] * 4.0, abs=0.05)
    assert doc["verdict"]["cost"] == pytest.approx(doc["verdict"]["gpu_hours"] * 4.0, abs=0.05)
    assert "USD" in render_job(doc)
    assert job_summary([str(demo_two_day_store)], "41006")["cost"] is None


def test_a_pod_seen_in_one_dcgm_scrape(tmp_path: Path) -> None:
    """A dcgm-exporter scrape names pods by namespace/name; one scrape is one instant."""
    store = tmp_path / "scrape.duckdb"
    imported = run_aiscope(
        "import", "dcgm", str(REPO / "fixtures" / "captures" / "dcgm-mig-pods.prom"),
        "--store", str(store),
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    doc = job_summary([str(store)], "serving/llama-7b-5d9f8")
    assert doc["job"]["kind"] == "pod" and doc["window"]["hours"] == 0.0
    assert doc["class"]["class"] == "inference" and doc["class"]["confidence"] == 0.5
    assert doc["verdict"]["summary"].startswith("too short to judge")
    assert doc["gpus"][0]["memory_peak_bytes"] <= doc["gpus"][0]["memory_total_bytes"]
