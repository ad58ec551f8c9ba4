"""Owners and money: every GPU-hour accounted to one owner (team, namespace, account, user,
idle capacity), shared GPUs split by measured share, priced so the lines add up to the bill."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.store import Store
from analyzer.analysis import analyze
from analyzer.load import InputError, TenantBucket
from analyzer.owners import UNOWNED, split
from analyzer.prices import from_file, from_mapping
from report.content import money
from report.html import render as render_html
from report.markdown import render as render_md
from report.table import render_text as render_table
from report.text import render as render_text
from sim.engine import simulate
from sim.scenario import ScenarioError
from sim.scenario import load as load_scenario
from store.schema import Device, GpuSample, Process, ProcessSample
from tests.conftest import REPO, query, run_aiscope

T0 = 1_764_000_000.0
GIB = 1 << 30
DEMO_CONFIG = REPO / "aiscope" / "demo-config.toml"

# -- the split of one shared interval ------------------------------------------------------------


def _tb(tenant: str, memory: float | None, sm: float | None) -> TenantBucket:
    return TenantBucket(0.0, tenant, memory, sm)


def test_a_lone_holder_gets_the_whole_interval() -> None:
    assert split((_tb("a", 5.0, None),)) == [("a", 1.0, "alone")]
    assert split(()) == []


def test_shared_intervals_split_by_sm_then_memory_then_evenly() -> None:
    by_sm = split((_tb("a", 10.0, 0.6), _tb("b", 30.0, 0.2)))
    assert [(n, round(s, 3), b) for n, s, b in by_sm] == [("a", 0.75, "sm"), ("b", 0.25, "sm")]
    # one holder without a per-process reading: its SM share is unknown, so memory decides
    by_memory = split((_tb("a", 10.0, 0.6), _tb("b", 30.0, None)))
    assert [(n, round(s, 3), b) for n, s, b in by_memory] == [
        ("a", 0.25, "memory"),
        ("b", 0.75, "memory"),
    ]
    # both idle (SM 0): memory held decides, not a division by zero
    assert [b for _, _, b in split((_tb("a", 1.0, 0.0), _tb("b", 3.0, 0.0)))] == ["memory"] * 2
    assert split((_tb("a", None, None), _tb("b", None, None))) == [
        ("a", 0.5, "even"),
        ("b", 0.5, "even"),
    ]


# -- config validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"owners": {"team": {}}}, r"owners\.team: unknown key \(known: teams, accounts\)"),
        ({"owners": {"teams": {"cv": ["usr:alice"]}}}, r"owners\.teams\.cv\[0\]: 'usr:alice'"),
        ({"owners": {"teams": {"cv": ["user:"]}}}, r"owners\.teams\.cv\[0\]"),
        ({"owners": {"teams": {"cv": ["user:a b"]}}}, r"owners\.teams\.cv\[0\]"),
        ({"owners": {"teams": {"cv": []}}}, r"owners\.teams\.cv: expected a non-empty list"),
        ({"owners": {"teams": {"cv": "user:alice"}}}, r"owners\.teams\.cv: expected a non-empty"),
        ({"owners": {"teams": {"(x)": ["user:a"]}}}, r"owners\.teams\.'\(x\)': a name is"),
        ({"owners": {"accounts": {"ml": ["a b"]}}}, r"owners\.accounts\.ml\[0\]"),
        ({"owners": "teams"}, r"owners must be a table"),
        ({"prices": {"gpu_hours": 2.0}}, r"prices\.gpu_hours: unknown key"),
        ({"prices": {"gpu_hour": -1}}, r"prices\.gpu_hour: must be a finite number, at least 0"),
        ({"prices": {"gpu_hour": "2"}}, r"prices\.gpu_hour: must be a number"),
        ({"prices": {"gpu_hour": math.inf}}, r"prices\.gpu_hour: must be a finite"),
        ({"prices": {"gpu_hour": 1, "kwh": True}}, r"prices\.kwh: must be a number"),
        ({"prices": {"currency": ""}}, r"prices\.currency"),
        ({"prices": {"kwh": 0.1}}, r"prices: set gpu_hour .* or \[prices\.models\]"),
        ({"prices": {"models": {"H100": "x"}}}, r"prices\.models\.'H100': must be a number"),
    ],
)
def test_bad_owners_and_prices_are_one_line_errors(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message) as caught:
        from_mapping(config, where="site.toml")
    assert str(caught.value).startswith("site.toml: ")
    assert "\n" not in str(caught.value)


def test_a_bad_config_exits_2_naming_file_and_key_before_reading_any_store(
    tmp_path: Path,
) -> None:
    config = tmp_path / "aiscope.toml"
    config.write_text('[owners.teams]\nvision = ["group:cv"]\n')
    store = tmp_path / "never-created.duckdb"
    result = run_aiscope("analyze", "--store", str(store), "--config", str(config))
    assert result.returncode == 2
    line = result.stderr.strip()
    assert line.startswith(f"aiscope: {config}: owners.teams.vision[0]: 'group:cv'")
    assert "\n" not in line and "Traceback" not in result.stderr
    assert result.stdout == "" and not store.exists()


def test_prices_match_models_in_file_order_with_a_default() -> None:
    prices = from_mapping(
        {"prices": {"gpu_hour": 1.5, "models": {"*A100*80GB*": 2.5, "a100": 2.0, "H100": 4.0}}}
    ).prices
    assert prices is not None
    assert prices.per_gpu_hour("NVIDIA A100-SXM4-80GB") == 2.5  # the first match wins
    assert prices.per_gpu_hour("NVIDIA A100-SXM4-40GB") == 2.0  # a word: anywhere, any case
    assert prices.per_gpu_hour("NVIDIA H100 80GB HBM3") == 4.0
    assert prices.per_gpu_hour("Tesla T4") == 1.5
    assert prices.per_gpu_hour(None) == 1.5
    only_models = from_mapping({"prices": {"models": {"H100": 4.0}}}).prices
    assert only_models is not None
    with pytest.raises(InputError, match=r"no price for GPU model 'Tesla T4'"):
        only_models.per_gpu_hour("Tesla T4")


# -- a simulated cluster with known owners -------------------------------------------------------

SCENARIO = """
name = "owners"
start = "2026-11-16T00:00:00Z"
days = 0.5
interval_seconds = 60
seed = 7

[[nodes]]
name = "n1"
gpu = "H100-80GB"
gpus = 8

[[nodes]]
name = "n2"
gpu = "A100-80GB"
gpus = 4

[[workloads]]
name = "pretrain"
kind = "training"
user = "alice"
placements = [{node = "n1", gpus = [0, 1, 2, 3]}]

[[workloads]]
name = "chat"
kind = "inference"
namespace = "serve-prod"
node = "n2"
gpus = [0, 1]
[workloads.params]
rps = 6.0
tp = 2
capacity_rps = 16.0

[[workloads]]
name = "nb"
kind = "interactive"
user = "alice"
node = "n2"
gpus = [2]

[[workloads]]
name = "scoring"
kind = "batch"
user = "carol"
node = "n1"
gpus = [4, 5]
start_hours = 2
end_hours = 8
[workloads.params]
window_start_hour = 0.0
window_hours = 24.0

[[workloads]]
name = "forgotten"
kind = "held"
user = "bob"
node = "n1"
gpus = [6]
"""
#: What each user or namespace ran, by the scenario: GPUs and hours.
TRUTH_GPU_HOURS = {
    "user:alice:slurm": 4 * 12.0,  # pretrain on 4 GPUs all window
    "user:alice:notebook": 12.0,
    "namespace:serve-prod": 2 * 12.0,
    "user:carol": 2 * 6.0,
    "user:bob": 12.0,
}
PRICES = {"currency": "EUR", "gpu_hour": 2.0, "kwh": 0.25, "models": {"H100": 4.0}}


def _analyze(store: Path, config: dict[str, Any]) -> dict[str, Any]:
    return analyze([str(store)], "7d", accounting=from_mapping(config))


def _by_owner(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["owner"]: o for o in doc["owners"]}


def test_each_owner_kind_gets_what_it_ran(owned_store: Path) -> None:
    owners = _by_owner(_analyze(owned_store, {}))
    assert {o["kind"] for o in owners.values()} == {"user", "namespace", "team"}
    # the contract's kinds only; the platform's own line says what it is
    assert owners[UNOWNED]["special"] == "unowned"
    assert {o["special"] for n, o in owners.items() if n != UNOWNED} == {None}
    # pods by namespace (from the pods table), everything else by the process's user
    chat = owners["serve-prod"]
    assert chat["kind"] == "namespace"
    assert chat["gpu_hours_total"] == pytest.approx(TRUTH_GPU_HOURS["namespace:serve-prod"], 0.02)
    assert chat["gpu_hours"]["inference"] > 0.9 * chat["gpu_hours_total"]
    alice = TRUTH_GPU_HOURS["user:alice:slurm"] + TRUTH_GPU_HOURS["user:alice:notebook"]
    assert owners["alice"]["gpu_hours_total"] == pytest.approx(alice, 0.02)
    assert owners["alice"]["gpu_hours"]["training"] > 0.9 * TRUTH_GPU_HOURS["user:alice:slurm"]
    assert owners["carol"]["gpu_hours_total"] == pytest.approx(TRUTH_GPU_HOURS["user:carol"], 0.05)
    # bob held a GPU with no compute all window: all of it idle, most of it an idle-held finding
    bob = owners["bob"]
    assert bob["gpu_hours_total"] == pytest.approx(12.0, 0.02)
    assert bob["idle_gpu_hours"] == pytest.approx(12.0, 0.02)
    assert bob["idle_held_gpu_hours"] == pytest.approx(12.0, 0.05)
    assert owners["alice"]["idle_held_gpu_hours"] < bob["idle_held_gpu_hours"]
    # nobody held n1/7, n2/3, and carol's GPUs outside her 6 hours: idle capacity
    assert owners[UNOWNED]["gpu_hours"]["idle"] == pytest.approx(2 * 12.0 + 2 * 6.0, 0.03)
    assert owners[UNOWNED]["cost"] is None  # no prices configured


def test_teams_and_accounts_from_the_config(owned_store: Path) -> None:
    doc = _analyze(
        owned_store,
        {
            "owners": {
                "teams": {"platform": ["namespace:serve-*", "user:carol"]},
                "accounts": {"ml": ["alice"]},
            }
        },
    )
    owners = _by_owner(doc)
    platform = owners["platform"]
    assert platform["kind"] == "team"
    assert platform["members"] == ["namespace:serve-prod", "user:carol"]
    expected = TRUTH_GPU_HOURS["namespace:serve-prod"] + TRUTH_GPU_HOURS["user:carol"]
    assert platform["gpu_hours_total"] == pytest.approx(expected, 0.03)
    # alice's Slurm job is her account's; her notebook (a systemd unit) stays hers
    assert owners["ml"]["kind"] == "account"
    assert owners["ml"]["gpu_hours_total"] == pytest.approx(
        TRUTH_GPU_HOURS["user:alice:slurm"], 0.02
    )
    assert owners["alice"]["gpu_hours_total"] == pytest.approx(
        TRUTH_GPU_HOURS["user:alice:notebook"], 0.02
    )
    assert "carol" not in owners and "serve-prod" not in owners


def test_owners_and_findings_add_up_to_the_bill(owned_store: Path) -> None:
    doc = _analyze(owned_store, {"prices": PRICES})
    bill = doc["bill"]
    owners = doc["owners"]
    gpu_hours = sum(doc["summary"]["gpu_hours"].values())
    assert sum(o["gpu_hours_total"] for o in owners) == pytest.approx(gpu_hours, abs=0.05)
    assert bill["gpu_hours"] == pytest.approx(gpu_hours, abs=0.05)
    # the bill from the store itself: GPU-hours per model times its price, energy from power
    h100, a100 = (_node_gpu_hours(owned_store, node) for node in ("n1", "n2"))
    assert bill["gpu_cost"] == pytest.approx(h100 * 4.0 + a100 * 2.0, rel=0.01)
    models = {m["model"]: (m["gpus"], m["gpu_hour"]) for m in bill["models"]}
    assert models == {"NVIDIA H100 80GB HBM3": (8, 4.0), "NVIDIA A100-SXM4-80GB": (4, 2.0)}
    ((joules,),) = query(
        owned_store, "SELECT sum(power_watts) * 60 FROM gpu_samples WHERE power_watts IS NOT NULL"
    )
    assert bill["energy_kwh"] == pytest.approx(float(joules) / 3.6e6, rel=0.01)
    assert bill["energy_cost"] == pytest.approx(bill["energy_kwh"] * 0.25, abs=0.05)
    assert bill["cost"] == pytest.approx(bill["gpu_cost"] + bill["energy_cost"], abs=0.01)
    # every owner's cost, the idle line included, adds up to it within rounding
    assert UNOWNED in {o["owner"] for o in owners}
    assert sum(o["cost"] for o in owners) == pytest.approx(bill["cost"], abs=0.005 * len(owners))
    assert bill["currency"] == "EUR"
    # a finding's cost is its lost GPU-hours at its GPU's price, and it names its owner
    held = next(f for f in doc["findings"] if f["kind"] == "idle_held" and f["node"] == "n1")
    assert held["owner"] == "bob"
    assert held["cost"] == pytest.approx(held["gpu_hours_lost"] * 4.0, abs=0.05)
    bob = _by_owner(doc)["bob"]
    assert bob["waste_cost"] == pytest.approx(held["cost"], abs=0.01)


def _node_gpu_hours(store: Path, node: str) -> float:
    """A node's GPU-hours from its samples: GPUs times the window (sampled without gaps)."""
    ((gpus, seconds),) = query(
        store,
        f"SELECT count(DISTINCT uuid), max(ts) - min(ts) FROM gpu_samples WHERE node = '{node}'",
    )
    return float(gpus) * float(seconds) / 3600.0


# -- two tenants on one GPU with known shares ----------------------------------------------------


def _shared_store(path: Path, second_user: str | None = "bob") -> Path:
    """One H100 for two hours: job 1 alone for the first hour; then job 1 and pod 2 together,
    their own SM utilization 0.6 and 0.2 (a 3:1 split) for 30 minutes, and for the last 30
    minutes without per-process readings, holding 10 and 30 GiB (a 1:3 split by memory)."""
    store = Store(path)
    uuid = "GPU-shared-0"
    records: list[object] = [
        Device(
            node="n1",
            uuid=uuid,
            gpu_index=0,
            name="NVIDIA H100 80GB HBM3",
            pci_bus_id=None,
            memory_total_bytes=80 * GIB,
            power_limit_watts=700.0,
            mig_mode=False,
            driver_version="560.35",
            nvlink_count=18,
            last_seen_ts=T0,
        ),
        Process(
            "n1",
            11,
            1,
            "python",
            "train.py",
            "alice",
            "/slurm/uid_1/job_7/step_0",
            "7",
            None,
            None,
            None,
            T0,
            T0 + 7200,
        ),
        Process(
            "n1",
            22,
            2,
            "python",
            "serve.py",
            second_user,
            "/system.slice/serve.service",
            None,
            None,
            None,
            "serve.service",
            T0,
            T0 + 7200,
        ),
    ]
    for m in range(120):
        ts = T0 + 60 * m
        records.append(
            GpuSample(
                ts,
                "n1",
                uuid,
                0,
                True,
                utilization_gpu_ratio=0.9,
                memory_used_bytes=40 * GIB,
                power_watts=500.0,
            )
        )
        late = m >= 90
        records.append(ProcessSample(ts, "n1", uuid, 11, 1, 10 * GIB, None if late else 0.6))
        if m >= 60:
            records.append(ProcessSample(ts, "n1", uuid, 22, 2, 30 * GIB, None if late else 0.2))
    store.add(records)
    store.flush()
    store.close()
    return path


def test_a_shared_gpu_is_split_by_measured_share(tmp_path: Path) -> None:
    doc = _analyze(_shared_store(tmp_path / "shared.duckdb"), {"prices": {"gpu_hour": 4.0}})
    owners = _by_owner(doc)
    # alice: the first hour alone, 3/4 of the SM-measured half hour, 1/4 of the memory half hour
    assert owners["alice"]["gpu_hours_total"] == pytest.approx(1.0 + 0.375 + 0.125, abs=0.02)
    assert owners["bob"]["gpu_hours_total"] == pytest.approx(0.125 + 0.375, abs=0.02)
    assert owners["alice"]["cost"] + owners["bob"]["cost"] == pytest.approx(
        doc["bill"]["cost"], abs=0.01
    )
    (evidence,) = [e for e in owners["bob"]["evidence"] if e.startswith("shared GPUs split")]
    assert "by per-process SM utilization" in evidence and "by memory held" in evidence
    assert "0.0 GPU-h held alone" in evidence
    assert "held alone" in " ".join(owners["alice"]["evidence"])


# -- the report and the demo ---------------------------------------------------------------------


def test_the_report_shows_owners_and_money(owned_store: Path) -> None:
    doc = _analyze(
        owned_store,
        {"owners": {"teams": {"serving": ["namespace:serve-*"]}}, "prices": PRICES},
    )
    md = render_md(doc)
    section = md[md.index("## Owners") : md.index("## Per node")]
    assert "| serving | team |" in section and "| bob | user |" in section
    assert "| (unowned) | unowned |" in section
    total = next(line for line in section.splitlines() if line.startswith("| total |"))
    assert f"€{doc['bill']['cost']:,.0f}" in total  # the table adds up to the bill
    assert f"Cost €{doc['bill']['cost']:,.0f}" in md[: md.index("## Fleet timeline")]
    bob = _by_owner(doc)["bob"]
    waste = f"- bob (user): {bob['idle_held_gpu_hours']:,.1f} GPU-h idle-held, 0.0 GPU-h starved"
    assert f"{waste} ({money(bob['waste_cost'], doc)})" in section
    for action in doc["summary"]["top_actions"]:  # each top action says what it cost
        assert f"{action['gpu_hours']:,.0f} GPU-hours" in md and action["cost"] > 0
        assert f"({money(action['cost'], doc)})" in md
    page = render_html(doc)
    assert '<section id="owners">' in page and '<a href="#owners">' in page
    assert "cost of the window" in page
    buffer = io.StringIO()
    render_text(doc, file=buffer, width=160)
    assert "Owners" in buffer.getvalue() and "serving" in buffer.getvalue()
    table = render_table(doc)
    assert f"owners: {len(doc['owners'])} ({doc['bill']['gpu_hours']:.1f} GPU-h, €" in table
    assert any(line.startswith("serving ") and "team" in line for line in table.splitlines())
    # unpriced: GPU-hours, no money anywhere
    plain = render_md(_analyze(owned_store, {}))
    assert "## Owners" in plain and "Cost " not in plain and "€" not in plain


def test_the_demo_prices_its_teams_and_adds_up(demo_two_day_store: Path) -> None:
    """The demo's scenario for two days at its 5-minute cadence (the session's store, simulated
    once for this and the job, notify and README tests), with the bundled example config
    `aiscope demo` uses."""
    doc = analyze([str(demo_two_day_store)], "7d", accounting=from_file(DEMO_CONFIG))
    owners = _by_owner(doc)
    assert {n: o["kind"] for n, o in owners.items()} == {
        "llm": "team",
        "search": "team",
        "research": "team",
        "support": "team",
        "bob": "user",
        UNOWNED: "team",
    }
    assert owners["llm"]["members"] == ["account:llm", "namespace:chat-prod"]
    assert owners["support"]["members"] == ["namespace:support-prod"]
    assert owners["search"]["members"] == ["namespace:search-prod", "user:carol"]
    assert owners["llm"]["starved_gpu_hours"] > 0  # the starved pre-training and fine-tune
    assert owners["bob"]["idle_held_gpu_hours"] > 40  # his kernel held a GPU both days
    assert sum(o["cost"] for o in doc["owners"]) == pytest.approx(doc["bill"]["cost"], abs=0.03)
    # 28 H100 at 4.00 and 8 A100 at 2.20 for two days, and the energy at 0.12 per kWh
    gpu_cost = (28 * 4.0 + 8 * 2.2) * 48
    assert doc["bill"]["gpu_cost"] == pytest.approx(gpu_cost, rel=0.01)
    assert doc["bill"]["cost"] == pytest.approx(gpu_cost + doc["bill"]["energy_kwh"] * 0.12, 0.01)


def test_a_namespace_is_only_for_workloads_in_pods(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.toml"
    scenario.write_text(SCENARIO.replace('user = "carol"', 'namespace = "batch"'))
    with pytest.raises(ScenarioError, match="workload scoring: namespace is for workloads"):
        simulate(load_scenario(str(scenario)), tmp_path / "never.duckdb", days=0.01)
    bad_user = SCENARIO.replace('user = "bob"', 'user = "Bob Smith"')
    scenario.write_text(bad_user)
    with pytest.raises(ScenarioError, match=r"workloads\[4\]\.user: expected a lower-case name"):
        load_scenario(str(scenario))


def test_mig_instances_cost_their_slices_and_the_bill_is_the_physical_gpus(
    tmp_path: Path,
) -> None:
    """The built-in 'mig' scenario: 2 A100 and 2 H100, partitioned, one A100 with a slice no
    instance holds. An instance-hour costs its compute slices' share of its GPU's hour."""
    store = tmp_path / "mig.duckdb"
    simulate(load_scenario("mig"), store, days=0.25)
    doc = _analyze(store, {"prices": {"models": {"A100": 2.0, "H100": 4.0}}})
    ((seconds,),) = query(store, "SELECT max(ts) - min(ts) FROM gpu_samples")
    hours = float(seconds) / 3600.0
    ((physical,),) = query(store, "SELECT count(*) FROM devices WHERE parent_uuid IS NULL")
    assert physical == 4
    assert doc["bill"]["gpu_cost"] == pytest.approx(hours * (2 * 2.0 + 2 * 4.0), rel=0.02)
    assert sum(o["cost"] for o in doc["owners"]) == pytest.approx(doc["bill"]["cost"], abs=0.05)
    unowned = _by_owner(doc)[UNOWNED]
    assert any("MIG compute slices no instance holds" in e for e in unowned["evidence"])


_readings = st.lists(
    st.tuples(
        st.one_of(st.none(), st.floats(0, 200 * GIB)),
        st.one_of(st.none(), st.floats(0, 1)),
    ),
    min_size=1,
    max_size=6,
)


@given(_readings)
def test_a_split_always_hands_out_the_whole_interval(readings: list[tuple[Any, Any]]) -> None:
    present = tuple(_tb(f"t{i}", m, s) for i, (m, s) in enumerate(readings))
    shares = split(present)
    assert [n for n, _, _ in shares] == [tb.tenant for tb in present]
    assert all(share >= 0 for _, share, _ in shares)
    assert sum(share for _, share, _ in shares) == pytest.approx(1.0)
    assert len({basis for _, _, basis in shares}) == 1  # one measure for the whole interval


def test_a_workload_without_user_or_namespace_is_unattributed_and_named(tmp_path: Path) -> None:
    doc = _analyze(_shared_store(tmp_path / "anon.duckdb", second_user=None), {})
    anon = _by_owner(doc)["(unattributed)"]
    assert (anon["kind"], anon["special"]) == ("team", "unattributed")
    assert anon["gpu_hours_total"] == pytest.approx(0.5, abs=0.02)
    assert anon["workloads"] == ["unit serve.service"]
    assert any("no user, namespace or account: unit serve.service" in e for e in anon["evidence"])
    assert not any("no process seen" in e for e in anon["evidence"])
