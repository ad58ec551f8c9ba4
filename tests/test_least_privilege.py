"""Least privilege in the cluster (issue #27 §5): who may scrape the agent, what its series say
about people, and what it may ask the API server."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.attribution import ProcReader
from agent.config import ConfigError, load_config
from agent.exporter import AgentCollector, build_registry, render
from agent.host import HostReader
from agent.nvml import Nvml
from agent.sampler import Sampler
from agent.store import Store
from sim.vnvml import VirtualProcess
from tests.conftest import FIXTURES, REPO, FakeClock, library, make_gpu, require_tool

K8S = REPO / "deploy" / "kubernetes"


def _process_series(tmp_path: Path, clock: FakeClock, identity_labels: bool) -> list:
    gpus = [make_gpu(0, processes=[VirtualProcess(4101, 70 << 30, 0.9)])]
    store = Store(tmp_path / "s.duckdb")
    sampler = Sampler(
        "gpu-node-01",
        Nvml(library(gpus, clock)),
        HostReader("gpu-node-01", proc_root=FIXTURES / "proc", sys_root=tmp_path),
        ProcReader(FIXTURES / "proc", user_name=lambda uid: "alice"),
        store,
        clock=clock,
    )
    sampler.start()
    clock.advance(1)
    sampler.tick()
    sampler.scan_processes()
    collector = AgentCollector(sampler.snapshot, store.stats, "t", identity_labels=identity_labels)
    text = render(build_registry([collector], process_metrics=False)).decode()
    sampler.stop()
    return [
        s
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith("aiscope_gpu_process_")
    ]


def test_identity_labels_off_drops_user_and_comm_and_keeps_the_rest(tmp_path, clock) -> None:
    with_identity = _process_series(tmp_path / "a", clock, identity_labels=True)
    assert with_identity and all(s.labels["user"] == "alice" for s in with_identity)
    assert all(s.labels["comm"] for s in with_identity)
    without = _process_series(tmp_path / "b", clock, identity_labels=False)
    assert len(without) == len(with_identity)
    for s in without:
        assert "user" not in s.labels and "comm" not in s.labels
        assert s.labels["pid"] == "4101" and s.labels["slurm_job_id"] == "41823"
        assert "pod_uid" in s.labels and "systemd_unit" in s.labels


def test_identity_labels_is_a_flag_a_variable_and_a_key(tmp_path) -> None:
    base = {"store": str(tmp_path / "s.duckdb"), "listen": "127.0.0.1:0"}
    assert load_config(base, env={}).identity_labels is True
    assert load_config({**base, "identity_labels": False}, env={}).identity_labels is False
    assert not load_config(base, env={"AISCOPE_IDENTITY_LABELS": "false"}).identity_labels
    toml = tmp_path / "a.toml"
    toml.write_text("[agent]\nidentity_labels = false\n")
    assert load_config(base, env={}, config_file=toml).identity_labels is False
    with pytest.raises(ConfigError, match="AISCOPE_IDENTITY_LABELS"):
        load_config(base, env={"AISCOPE_IDENTITY_LABELS": "perhaps"})


def _built() -> dict[tuple[str, str], dict]:
    kubectl = require_tool("kubectl")
    built = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, check=False
    )
    assert built.returncode == 0, built.stderr
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(built.stdout)}


def test_the_network_policy_admits_only_the_monitoring_namespace_on_the_metrics_port() -> None:
    docs = _built()
    policy = docs[("NetworkPolicy", "aiscope-agent")]["spec"]
    pod_labels = docs[("DaemonSet", "aiscope-agent")]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    # The port the policy names is the agent's metrics port, and nothing else is exposed.
    agent = docs[("DaemonSet", "aiscope-agent")]["spec"]["template"]["spec"]["containers"][0]
    assert [p["name"] for p in agent["ports"]] == ["metrics"]


def test_the_daemonset_drops_identity_labels_lists_only_pods_and_reads_only_owners(
    tmp_path,
) -> None:
    docs = _built()
    config = docs[("ConfigMap", "aiscope-config")]["data"]["aiscope.toml"]
    toml = tmp_path / "aiscope.toml"
    toml.write_text(config)
    agent = load_config(
        {"store": str(tmp_path / "s.duckdb"), "listen": "127.0.0.1:0"}, env={}, config_file=toml
    )
    assert agent.identity_labels is False
    # RBAC cannot restrict a list to a field selector (docs/deploy.md): list pods, nothing more;
    # and get (never list, watch or write) the controllers that own them, for declared intent.
    role = docs[("ClusterRole", "aiscope-agent")]
    assert role["rules"][0] == {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
    owners = {r for rule in role["rules"][1:] for r in rule["resources"]}
    assert owners == {"replicasets", "statefulsets", "deployments", "jobs", "rayclusters"}
    assert all(rule["verbs"] == ["get"] for rule in role["rules"][1:])
    assert not [k for k in docs if k[0] in ("Role", "RoleBinding")]


def test_the_hostpath_store_is_closed_to_other_users_before_it_is_handed_over() -> None:
    pod = _built()[("DaemonSet", "aiscope-agent")]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    script = init["command"][-1]
    # chmod while root still owns it (no CAP_FOWNER needed), then chown: mode 0750, uid 65532
    assert script.index("chmod 0750 /var/lib/aiscope") < script.index("chown 65532:65532")
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}


def _ray_pods() -> dict[str, dict]:
    """Every pod spec the Ray manifests make: head, workers and submitter, job and cron job."""
    from tests.test_deploy import ray_manifests

    docs = ray_manifests()
    pods = {}
    for name, spec in (
        ("rayjob", docs[("RayJob", "aiscope-analyze")]["spec"]),
        ("raycronjob", docs[("RayCronJob", "aiscope-weekly-report")]["spec"]["jobTemplate"]),
    ):
        cluster = spec["rayClusterSpec"]
        pods[f"{name} head"] = cluster["headGroupSpec"]["template"]["spec"]
        for group in cluster["workerGroupSpecs"]:
            pods[f"{name} {group['groupName']}"] = group["template"]["spec"]
        pods[f"{name} submitter"] = spec["submitterPodTemplate"]["spec"]
    return pods


def test_the_ray_pods_run_unprivileged_without_an_api_token() -> None:
    pods = _ray_pods()
    assert len(pods) == 6
    for where, pod in pods.items():
        assert pod["automountServiceAccountToken"] is False, where
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["runAsUser"] == 1000, where  # Ray's image's user ray
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where
            assert {"requests", "limits"} <= set(container["resources"]), where
            assert container["image"] == "ghcr.io/aiscope-dev/aiscope-ray:0.1.0", where
        # What a read-only root needs written (Ray's sessions) is a volume of the pod's own.
        mounts = {m["mountPath"] for c in pod["containers"] for m in c["volumeMounts"]}
        assert "/tmp" in mounts, where


def test_the_ray_pods_read_the_fleet_with_workload_identity_not_secrets() -> None:
    from tests.test_deploy import ray_manifests

    docs = ray_manifests()
    account = docs[("ServiceAccount", "aiscope-ray")]
    assert account["automountServiceAccountToken"] is False
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws")
    assert not [k for k in docs if k[0] in ("Secret", "Role", "ClusterRole")]
    secretish = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")
    for where, pod in _ray_pods().items():
        if not where.endswith("submitter"):
            assert pod["serviceAccountName"] == "aiscope-ray", where
        for container in pod["containers"]:
            for ref in container.get("envFrom", []):
                assert "secretRef" not in ref, where
            for env in container.get("env", []):
                assert "secretKeyRef" not in env.get("valueFrom", {}), where
                assert not any(word in env["name"] for word in secretish), (where, env["name"])
    config = docs[("ConfigMap", "aiscope-ray")]["data"]
    assert not any(word in key for key in config for word in secretish)
