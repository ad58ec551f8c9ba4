"""Every deploy file passes its ecosystem's own validator, and a real Prometheus scrapes a real
agent with the real rules loaded."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, require_tool
from tests.test_cli import _free_port, _wait_for

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
RULES = DEPLOY / "prometheus" / "aiscope-rules.yaml"
CRDS = ("servicemonitor.yaml", "prometheusrule.yaml")
VENV_BIN = Path(sys.executable).parent


def _run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, check=False, **kwargs
    )


# -- Prometheus rules ---------------------------------------------------------------------------


def test_rules_check_and_unit_tests() -> None:
    promtool = require_tool("promtool")
    check = _run(promtool, "check", "rules", RULES)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = _run(promtool, "test", "rules", "aiscope-rules.test.yaml", cwd=DEPLOY / "prometheus")
    assert tests.returncode == 0, tests.stdout + tests.stderr


def test_every_rule_has_a_unit_test_a_runbook_and_a_severity() -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    tested = (DEPLOY / "prometheus" / "aiscope-rules.test.yaml").read_text()
    runbooks = (REPO / "docs" / "runbooks.md").read_text().lower()
    for rule in rules:
        name = rule["alert"]
        assert f"alertname: {name}\n" in tested, name
        assert rule["labels"]["severity"] in ("warning", "critical")
        anchor = rule["annotations"]["runbook_url"].split("#")[1]
        assert anchor == name.lower() and f"## {name.lower()}" in runbooks, name
    # At least one expectation that a rule must NOT fire.
    assert "exp_alerts: []" in tested


def test_prometheusrule_is_generated_from_the_rules() -> None:
    result = _run(sys.executable, DEPLOY / "prometheus" / "generate.py", "--check")
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load((K8S / "prometheusrule.yaml").read_text())
    assert manifest["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_alert_thresholds_come_from_the_analyzers_thresholds(tmp_path: Path) -> None:
    """The defaults and a user's [thresholds] override reach the alerts, not only the report."""
    from analyzer.thresholds import Thresholds

    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    th = Thresholds()
    assert rules["AiscopeGpuIdleHeld"]["expr"].endswith(f"> {th.idle_held_window_seconds:g}")
    assert rules["AiscopeNoisyNeighbor"]["expr"].endswith(f"> {th.noisy_min_slowdown_ratio:g}")
    config = tmp_path / "aiscope.toml"
    config.write_text(
        "[thresholds]\nidle_held_window_seconds = 7200\nnoisy_min_slowdown_ratio = 0.2\n"
    )
    out = tmp_path / "rules.yaml"
    gen = DEPLOY / "prometheus" / "generate.py"
    result = _run(sys.executable, gen, "--config", config, "--out", out)
    assert result.returncode == 0, result.stderr
    mine = {r["alert"]: r for g in yaml.safe_load(out.read_text())["groups"] for r in g["rules"]}
    assert mine["AiscopeGpuIdleHeld"]["expr"].endswith("> 7200")
    assert "over 2 hours" in mine["AiscopeGpuIdleHeld"]["annotations"]["description"]
    assert mine["AiscopeNoisyNeighbor"]["expr"].endswith("> 0.2")
    config.write_text("[thresholds]\nnoisy_min_slowdown_ratio = 2\n")
    bad = _run(sys.executable, gen, "--config", config, "--out", out)
    assert bad.returncode == 2 and "noisy_min_slowdown_ratio" in bad.stderr


# -- Kubernetes ---------------------------------------------------------------------------------


def test_manifests_validate_strictly() -> None:
    files = sorted(p for p in K8S.glob("*.yaml") if p.name not in (*CRDS, "kustomization.yaml"))
    result = _run(VENV_BIN / "kubernetes-validate", "--strict", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed") >= len(files)


def test_kustomize_builds_and_wires_together() -> None:
    kubectl = require_tool("kubectl")
    built = _run(kubectl, "kustomize", K8S)
    assert built.returncode == 0, built.stderr
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(built.stdout)}
    ds = docs[("DaemonSet", "aiscope-agent")]
    pod = ds["spec"]["template"]["spec"]
    agent = next(c for c in pod["containers"] if c["name"] == "agent")
    assert pod["hostPID"] is True and pod["securityContext"]["runAsNonRoot"] is True
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    assert agent["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert agent["livenessProbe"]["httpGet"]["path"] == "/metrics"
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "nvidia.com/gpu" not in agent["resources"].get("limits", {})
    assert {"requests", "limits"} <= set(agent["resources"])
    role = docs[("ClusterRole", "aiscope-agent")]
    # list pods; get only the owners a pod's owner chain passes through (declared intent)
    assert role["rules"][0] == {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
    assert all(r["verbs"] == ["get"] for r in role["rules"][1:])
    assert {res for r in role["rules"][1:] for res in r["resources"]} == {
        "replicasets",
        "statefulsets",
        "deployments",
        "jobs",
        "rayclusters",
    }
    service = docs[("Service", "aiscope-agent")]
    monitor = docs[("ServiceMonitor", "aiscope-agent")]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/name"
    assert service["metadata"]["labels"]["app.kubernetes.io/name"] == "aiscope"  # job="aiscope"
    assert all(
        d["metadata"].get("namespace") == "aiscope"
        for k, d in docs.items()
        if k[0] not in ("Namespace", "ClusterRole", "ClusterRoleBinding")
    )


def test_prometheusrule_spec_passes_promtool(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    spec = yaml.safe_load((K8S / "prometheusrule.yaml").read_text())["spec"]
    extracted = tmp_path / "rules.yaml"
    extracted.write_text(yaml.safe_dump(spec))
    result = _run(promtool, "check", "rules", extracted)
    assert result.returncode == 0, result.stdout + result.stderr


# -- systemd ------------------------------------------------------------------------------------


def _unit_for_this_machine(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this venv's aiscope (verify checks it exists)."""
    unit = tmp_path / "aiscope-agent.service"
    text = (DEPLOY / "systemd" / "aiscope-agent.service").read_text()
    unit.write_text(text.replace("/opt/aiscope/venv/bin/aiscope", str(VENV_BIN / "aiscope")))
    return unit


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = require_tool("systemd-analyze")
    result = _run(analyze, "verify", _unit_for_this_machine(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "aiscope-agent.service" not in result.stderr, result.stderr


def test_systemd_unit_exposure_is_at_most_2(tmp_path: Path) -> None:
    analyze = require_tool("systemd-analyze")
    units = [_unit_for_this_machine(tmp_path), DEPLOY / "systemd" / "aiscope-report.service"]
    for unit in units:
        result = _run(analyze, "security", "--offline=true", unit)
        match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
        assert match, result.stdout + result.stderr
        assert float(match.group(1)) <= 2.0, result.stdout


def test_weekly_report_timer_verifies() -> None:
    analyze = require_tool("systemd-analyze")
    systemd = DEPLOY / "systemd"
    result = _run(
        analyze, "verify", systemd / "aiscope-report.service", systemd / "aiscope-report.timer"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    timer = (systemd / "aiscope-report.timer").read_text()
    assert "Persistent=true" in timer and "OnCalendar=Mon" in timer
    service = (systemd / "aiscope-report.service").read_text()
    assert "aiscope report" in service and "-mtime +90 -delete" in service


def test_install_script_is_clean_shell() -> None:
    shellcheck = require_tool("shellcheck")
    result = _run(shellcheck, DEPLOY / "systemd" / "install.sh")
    assert result.returncode == 0, result.stdout


# -- container image and Grafana ----------------------------------------------------------------


def test_dockerfile_lints_clean() -> None:
    result = _run(VENV_BIN / "hadolint", DEPLOY / "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:\d+\.\d+\.\d+-slim-\w+ AS build$", text, re.M)  # pinned
    assert "USER 65532" in text


def _exported_names() -> set[str]:
    source = "\n".join(p.read_text() for p in (REPO / "agent").glob("*.py"))
    names = set(re.findall(r'"(aiscope_[a-z_]+)"', source))
    counters = {n + "_total" for n in names}
    return (
        names
        | counters
        | {
            "aiscope_agent_process_cpu_seconds_total",
            "aiscope_agent_process_resident_memory_bytes",
            "up",
        }
    )


def test_grafana_dashboard_uses_only_metrics_we_export() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "aiscope.json").read_text())
    assert dashboard["uid"] and dashboard["panels"]
    exported = _exported_names()
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    for expr in exprs:
        for name in re.findall(r"\b(aiscope_[a-z_]+)\b", expr):
            assert name in exported, f"{name} in {expr!r} is not exported"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


# -- a real Prometheus scraping a real agent ----------------------------------------------------


def _query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.loads(r.read())["data"]["result"]
    except OSError:
        return []


def _alerts(port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=2) as r:
        return {a["labels"]["alertname"] for a in json.loads(r.read())["data"]["alerts"]}


@pytest.mark.slow
def test_real_prometheus_scrapes_the_agent_and_loads_the_rules(tmp_path: Path) -> None:
    prometheus = require_tool("prometheus")
    agent_port, prom_port = _free_port(), _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {
                        "job_name": "aiscope",
                        "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}],
                    }
                ],
            }
        )
    )
    check = _run(require_tool("promtool"), "check", "config", config)
    assert check.returncode == 0, check.stdout + check.stderr
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aiscope",
            "agent",
            "run",
            "--virtual-gpus",
            "2",
            "--store",
            str(tmp_path / "s.duckdb"),
            "--listen",
            f"127.0.0.1:{agent_port}",
            "--duration",
            "90",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    server = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        up = _wait_for(
            lambda: [r for r in _query(prom_port, 'up{job="aiscope"}') if r["value"][1] == "1"],
            timeout=60,
            what="up == 1",
        )
        assert len(up) == 1
        gpus = _wait_for(lambda: _query(prom_port, "aiscope_gpu_up"), timeout=30, what="GPU series")
        assert {r["metric"]["gpu"] for r in gpus} == {"0", "1"}
        assert _query(prom_port, "aiscope_build_info")
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{prom_port}/api/v1/rules", timeout=2
            ) as r:
                groups = json.loads(r.read())["data"]["groups"]
            rules = [rule for g in groups for rule in g["rules"]]
            if rules and all(rule.get("lastEvaluation", "").startswith("20") for rule in rules):
                break
            assert time.monotonic() < deadline, "rules were never evaluated"
            time.sleep(0.5)
        assert len(rules) == 12
        assert all(rule["health"] == "ok" for rule in rules), [
            (rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"
        ]
        # The absent() guard was pending before the first scrape; with the agent up it clears.
        _wait_for(
            lambda: not _alerts(prom_port) & {"AiscopeAgentAbsent", "AiscopeAgentDown"},
            timeout=30,
            what="the agent-absent guard to clear",
        )
    finally:
        server.terminate()
        agent.terminate()
        server.wait(timeout=30)
        agent.wait(timeout=30)
    assert shutil.which("prometheus")


def test_the_image_copies_every_package() -> None:
    """The container installs the project from the packages it copies: each of the rooms."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    for pattern in include:
        package = pattern.rstrip("*")
        assert f"COPY {package} ./{package}\n" in dockerfile, package


# -- Ray: KubeRay's RayJob and RayCronJob, and the Slurm script (issue #25) -----------------------

RAY_K8S = K8S / "ray"


def ray_manifests() -> dict[tuple[str, str], dict]:
    """``kubectl kustomize deploy/kubernetes/ray``, by (kind, name)."""
    kubectl = require_tool("kubectl")
    built = _run(kubectl, "kustomize", RAY_K8S)
    assert built.returncode == 0, built.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(built.stdout)}


def test_the_rayjob_analyzes_the_fleet_location_on_its_own_cluster() -> None:
    docs = ray_manifests()
    job = docs[("RayJob", "aiscope-analyze")]["spec"]
    entry = " ".join(job["entrypoint"].split())
    assert 'aiscope analyze --engine ray --address auto --store "$AISCOPE_FLEET"' in entry
    assert entry.startswith("set -eu;") and '> "$out"' in entry
    assert job["shutdownAfterJobFinishes"] is True and job["activeDeadlineSeconds"] > 0
    cluster = job["rayClusterSpec"]
    assert cluster["authOptions"] == {"mode": "token"}  # KubeRay hands every pod the token
    # The image's Ray is the cluster's: the Dockerfile's ray target is Ray's image at that tag.
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert f"FROM rayproject/ray:{cluster['rayVersion']}-py312-cpu AS ray\n" in dockerfile
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"configMapRef": {"name": "aiscope-ray"}} in head["envFrom"]
    config = docs[("ConfigMap", "aiscope-ray")]["data"]
    assert config["AISCOPE_FLEET"].startswith("s3://") and config["AISCOPE_SINCE"] == "7d"
    assert all(d["metadata"]["namespace"] == "aiscope" for d in docs.values())


def test_the_raycronjob_is_the_rayjob_weekly_with_the_reports() -> None:
    docs = ray_manifests()
    cron = docs[("RayCronJob", "aiscope-weekly-report")]["spec"]
    assert cron["schedule"] == "0 6 * * 1" and cron["timeZone"] == "Etc/UTC"
    template = dict(cron["jobTemplate"])
    entry = " ".join(template.pop("entrypoint").split())
    assert 'aiscope report --engine ray --address auto --store "$AISCOPE_FLEET"' in entry
    for suffix in ("html", "md", "json"):
        assert f'--out "/fleet/reports/aiscope-$d.{suffix}"' in entry
    assert "-mtime +90 -delete" in entry  # kept as long as the one-machine CronJob keeps them
    # Everything but what it runs is the one-off RayJob's: the two cannot drift apart.
    job = dict(docs[("RayJob", "aiscope-analyze")]["spec"])
    job.pop("entrypoint")
    assert template == job


def test_the_analyze_sbatch_is_clean_shell_and_starts_ray_across_the_allocation() -> None:
    script = DEPLOY / "slurm" / "aiscope-analyze.sbatch"
    shellcheck = require_tool("shellcheck")
    result = _run(shellcheck, script)
    assert result.returncode == 0, result.stdout
    text = script.read_text()
    assert "\nset -euo pipefail\n" in text
    assert re.search(r'srun [^\n]*-w "\$head_node" \\\n\s+"\$RAY" start --head', text)
    assert re.search(r'srun [^\n]*-w "\$node" \\\n\s+"\$RAY" start --block --address=', text)
    assert "--include-dashboard=false" in text and "export RAY_AUTH_MODE=token" in text
    assert '"$AISCOPE" report --engine ray --address auto --store "$FLEET"' in text
    assert "trap stop_ray EXIT" in text and '"$RAY" stop' in text
