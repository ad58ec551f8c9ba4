"""Declared beside observed, end to end on a simulated cluster whose workloads declare their
intent, one of them wrongly (a PyTorchJob's pods declared a Notebook), and the combination
rules on verdicts built by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer import declared
from analyzer.analysis import analyze
from analyzer.classify import GpuVerdict, Segment, classify
from analyzer.load import FleetData, GpuInfo, TenantBucket, load
from sim.engine import simulate
from sim.scenario import ScenarioError
from sim.scenario import load as load_scenario
from store.intent import Declared
from tests.conftest import run_aiscope

SCENARIO = """
name = "declared"
description = "Declared intent, right and wrong."
start = "2026-11-16T00:00:00Z"
days = 1
interval_seconds = 60
seed = 11

[[nodes]]
name = "n1"
gpu = "H100-80GB"
gpus = 8
cpus = 96

# Pre-training in pods whose owner says Notebook: the wrong intent.
[[workloads]]
name = "gpt"
kind = "training"
namespace = "alice"
declared = "Notebook"
node = "n1"
gpus = [0, 1, 2, 3]

[[workloads]]
name = "chat"
kind = "inference"
namespace = "chat"
declared = "Deployment"
node = "n1"
gpus = [4, 5]
[workloads.params]
rps = 10.0
tp = 2
capacity_rps = 16.0

[[workloads]]
name = "pretrain"
kind = "training"
user = "priya"
declared = "slurm batch"
node = "n1"
gpus = [6, 7]
"""
HOURS = 0.25  # days simulated: six hours


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("declared")
    scenario = folder / "declared.toml"
    scenario.write_text(SCENARIO)
    path = folder / "s.duckdb"
    simulate(load_scenario(str(scenario)), path, days=HOURS)
    return path


@pytest.fixture(scope="module")
def doc(store: Path) -> dict:
    return analyze([str(store)], since="7d")


def test_each_gpu_carries_its_declaration(doc: dict) -> None:
    by_gpu = {g["gpu"]: g for g in doc["gpus"]}
    notebook = {
        "kind": "Notebook",
        "name": "alice/gpt",
        "implies": "interactive",
        "source": "kubernetes",
        "workload": "pod alice/gpt",
    }
    assert all(by_gpu[i]["declared"] == notebook for i in range(4))
    assert by_gpu[4]["declared"] == {
        "kind": "Deployment",
        "name": "chat/chat",
        "implies": "inference",
        "source": "kubernetes",
        "workload": "pod chat/chat",
    }
    # A Slurm batch job implies no class; its torchrun does, and speaks for it.
    assert by_gpu[6]["declared"]["kind"] == "torchrun"
    assert by_gpu[6]["declared"]["implies"] == "training"


def test_agreement_raises_confidence_and_weak_behaviour_yields(store: Path, doc: dict) -> None:
    """Each GPU meets its declaration by the rule its behaviour-only verdict calls for."""
    data = load([store], 7 * 86400.0)
    observed = {v.info.gpu_index: v for v in classify(data)}
    by_gpu = {g["gpu"]: g for g in doc["gpus"]}
    tenant = {g["gpu"]: g["declared"]["workload"] for g in doc["gpus"]}
    mismatched = {f["gpu"] for f in doc["findings"] if f["kind"] == "declared_mismatch"}
    rules = {}
    for i in range(8):
        v, g, implies = observed[i], by_gpu[i], by_gpu[i]["declared"]["implies"]
        if v.gpu_class == implies:
            rules[i] = "agrees"
            assert g["class"] == implies
            assert g["confidence"] > v.confidence or v.confidence >= 0.98
        elif v.confidence < declared.bar(data, tenant[i]):
            rules[i] = "as declared"
            assert g["class"] == implies and g["confidence"] == declared.DECLARED_WINS_CONFIDENCE
            assert "too weak to stand" in g["evidence"][0]
            assert i not in mismatched
        else:
            rules[i] = "stands"
            assert g["class"] == v.gpu_class and i in mismatched
        assert any(w in " ".join(g["evidence"]) for w in ("agrees", "too weak", "stands"))
    # The pre-training ranks are training beyond doubt, whatever they declare.
    assert [rules[i] for i in (0, 1, 2, 3, 6, 7)] == ["stands"] * 4 + ["agrees"] * 2


def test_a_strong_disagreement_is_a_finding_with_gpu_hours(doc: dict) -> None:
    by_gpu = {g["gpu"]: g for g in doc["gpus"]}
    assert all(by_gpu[i]["class"] == "training" for i in range(4))  # the behaviour stands
    assert all(any("observed class stands" in e for e in by_gpu[i]["evidence"]) for i in range(4))
    found = [f for f in doc["findings"] if f["kind"] == "declared_mismatch"]
    assert {0, 1, 2, 3} <= {f["gpu"] for f in found}
    f = next(f for f in found if f["workload"] == "pod alice/gpt")
    assert f["declared_kind"] == "Notebook" and f["declared_class"] == "interactive"
    assert f["observed_class"] == "training" and f["gpus"] == 4
    assert f["workload"] == "pod alice/gpt"
    assert 4.0 <= f["gpu_hours_lost"] <= HOURS * 24
    assert f["evidence"][0].startswith("Notebook alice/gpt, declared interactive, computed in")
    assert "runs 4 GPUs as training" in f["evidence"][1]
    assert f["computed_ratio"] > 0.9
    action = doc["summary"]["top_actions"][0]
    assert action["kind"] == "declared_mismatch" and action["gpus"] == 4
    assert action["action"] == "Check Notebook alice/gpt: declared interactive, runs as training"


@pytest.mark.usefixtures("real_traces")  # the stand-ins' ranks drift apart: it passes there
@pytest.mark.xfail(
    strict=True,
    reason="known: the calibrated classifier reads a tensor-parallel server's ranks, which move "
    "in lockstep, as training at 0.98 (the evaluation sets hold no tensor-parallel serving), so "
    "the behaviour stands against its Deployment and the mismatch is reported instead",
)
def test_a_tensor_parallel_server_is_named_inference_by_its_deployment(doc: dict) -> None:
    by_gpu = {g["gpu"]: g for g in doc["gpus"]}
    assert [by_gpu[i]["class"] for i in (4, 5)] == ["inference", "inference"]
    assert not [f for f in doc["findings"] if f["kind"] == "declared_mismatch" and f["gpu"] >= 4]


def test_every_view_shows_it(store: Path, tmp_path: Path) -> None:
    outs = [tmp_path / f"r.{ext}" for ext in ("md", "html", "json")]
    args = [a for o in outs for a in ("--out", str(o))]
    result = run_aiscope("report", "--store", str(store), *args)
    assert result.returncode == 0, result.stderr
    md, html = outs[0].read_text(), outs[1].read_text()
    for text in (md, html):
        assert "Notebook alice/gpt" in text and "Declared intent" in text
    assert json.loads(outs[2].read_text())["gpus"][0]["declared"]["kind"] == "Notebook"
    text = run_aiscope("report", "--store", str(store))
    assert text.returncode == 0 and "Notebook alice/gpt" in text.stdout


def test_job_shows_declared_beside_observed(store: Path) -> None:
    result = run_aiscope("job", "alice/gpt", "--store", str(store), "--format", "json")
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["declared"]["kind"] == "Notebook" and job["declared"]["implies"] == "interactive"
    assert job["class"]["class"] == "training"
    text = run_aiscope("job", "alice/gpt", "--store", str(store))
    assert "declared Notebook alice/gpt (kubernetes), implies interactive" in text.stdout
    assert "declared_mismatch" in text.stdout or "against its declaration" in text.stdout


def test_a_declared_kind_must_fit_how_the_workload_runs(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text(SCENARIO.replace('declared = "slurm batch"', 'declared = "Deployment"'))
    with pytest.raises(ScenarioError, match="workload pretrain: declared 'Deployment'"):
        simulate(load_scenario(str(scenario)), tmp_path / "never.duckdb", days=0.01)
    scenario.write_text(SCENARIO.replace('declared = "slurm batch"', 'declared = "Mainframe"'))
    with pytest.raises(ValueError, match="declared: unknown kind 'Mainframe'"):
        load_scenario(str(scenario))


# -- the rules on verdicts built by hand ----------------------------------------------------------

GPU = GpuInfo("n", "GPU-0", 0, "NVIDIA H100 80GB HBM3", 80.0 * (1 << 30), 700.0)


def _data(declarations: dict[str, tuple[Declared, ...]]) -> FleetData:
    tenancy = {"GPU-0": tuple(TenantBucket(300.0 * k, "pod ns/x", 4e10, None) for k in range(24))}
    return FleetData(
        0.0, 7200.0, 300, (GPU,), {}, {}, 60.0, tenancy=tenancy, declarations=declarations
    )


def _verdict(cls: str, confidence: float) -> GpuVerdict:
    segment = Segment(0.0, 7200.0, cls, confidence, ("behaviour",))
    return GpuVerdict(GPU, cls, confidence, ("behaviour",), (segment,))


NOTEBOOK = Declared("Notebook", "ns/x", "interactive", "kubernetes")


@pytest.mark.parametrize(
    ("observed", "confidence", "want_class", "want_confidence", "words"),
    [
        ("interactive", 0.6, "interactive", 0.8, "agrees"),
        ("inference", 0.55, "interactive", declared.DECLARED_WINS_CONFIDENCE, "too weak"),
        ("inference", 0.85, "inference", 0.85, "observed class stands"),
        ("idle", 0.9, "idle", 0.9, None),
    ],
)
def test_combination_rules(
    observed: str, confidence: float, want_class: str, want_confidence: float, words: str | None
) -> None:
    (v,) = declared.combine(_data({"pod ns/x": (NOTEBOOK,)}), [_verdict(observed, confidence)])
    assert (v.gpu_class, v.confidence) == (want_class, want_confidence)
    assert [s.gpu_class for s in v.segments] == [want_class]
    if words is None:
        assert v.evidence == ("behaviour",)
    else:
        assert any(words in e for e in v.evidence)


def test_a_program_signature_needs_stronger_behaviour_to_be_overruled() -> None:
    torchrun = Declared("torchrun", None, "training", "cmdline")
    data = _data({"pod ns/x": (torchrun,)})
    (v,) = declared.combine(data, [_verdict("inference", 0.85)])
    assert v.gpu_class == "training" and "too weak to stand" in v.evidence[0]
    (v,) = declared.combine(data, [_verdict("inference", 0.92)])
    assert v.gpu_class == "inference" and "observed class stands" in v.evidence[-1]
    assert declared.stands_at(torchrun) == declared.OBSERVED_STANDS_PROGRAM
    assert declared.stands_at(NOTEBOOK) == declared.OBSERVED_STANDS


def test_a_declaration_that_implies_nothing_changes_nothing() -> None:
    job = Declared("Job", "ns/x", None, "kubernetes")
    v = _verdict("inference", 0.55)
    assert declared.combine(_data({"pod ns/x": (job,)}), [v]) == [v]
    assert declared.combine(_data({}), [v]) == [v]


def test_the_most_specific_declaration_speaks() -> None:
    deployment = Declared("Deployment", "ns/x", "inference", "kubernetes")
    vllm = Declared("vllm", None, "inference", "cmdline")
    jupyter = Declared("jupyter", None, "interactive", "cmdline")
    assert declared.choose((vllm, deployment)) == deployment  # same class: the platform's name
    assert declared.choose((deployment, jupyter)) == jupyter  # a signature beats a controller
    assert declared.choose((jupyter, NOTEBOOK)) == NOTEBOOK
    assert declared.choose(()) is None


def test_published_segments_carry_the_declarations(store: Path, doc: dict, tmp_path: Path) -> None:
    """The fleet reader sees what a node store declares once it is published as segments."""
    fleet = tmp_path / "fleet"
    result = run_aiscope("publish", "--store", str(store), "--to", str(fleet))
    assert result.returncode == 0, result.stderr
    assert list(fleet.glob("table=declarations/day=*/node=n1/*.parquet"))
    through = json.loads(run_aiscope("analyze", "--store", str(fleet), "--format", "json").stdout)
    assert [g["declared"] for g in through["gpus"]] == [g["declared"] for g in doc["gpus"]]
    kinds = sorted(f["kind"] for f in through["findings"])
    assert kinds == sorted(f["kind"] for f in doc["findings"])
