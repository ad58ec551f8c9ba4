"""``--prometheus`` joins kube-state-metrics' pod owners and labels to the pods that held GPUs:
through a real Prometheus backfilled with dcgm-exporter and kube-state-metrics series in the
shapes those exporters write (labels as kube-state-metrics v2 sanitizes them)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agent.store import Store
from analyzer.analysis import analyze
from analyzer.load import bucket_for
from ingest.kube_state import label_key
from ingest.prometheus import PrometheusSource, read
from store.schema import Declaration
from store.storefile import read_records
from tests.conftest import require_tool
from tests.promserver import serve_backfill

T0 = 1_763_625_600.0  # 2026-11-20T08:00:00Z
MINUTES = 180
NODE = "gpu-node-07"
#: gpu -> (namespace, pod, container, utilization at minute m)
PODS = {
    0: ("chat", "chat-x-7d9f8b6c5d-x2kqp", "vllm", lambda m: 35.0 + 30.0 * math.sin(m / 9.0)),
    1: ("alice", "nb-0", "notebook", lambda m: 80.0 if m % 50 < 4 else 0.0),
    2: ("ml", "nightly-embed-29412960-z7d4k", "embed", lambda m: 97.0),
    3: ("scratch", "debug-gpu", "cuda", lambda m: 0.0),
}
#: kube-state-metrics: (series, labels) as it exports them for the pods above.
KSM = [
    (
        "kube_pod_owner",
        {
            "namespace": "chat",
            "pod": "chat-x-7d9f8b6c5d-x2kqp",
            "owner_kind": "ReplicaSet",
            "owner_name": "chat-x-7d9f8b6c5d",
            "owner_is_controller": "true",
            "uid": "u0",
        },
    ),
    (
        "kube_pod_owner",
        {
            "namespace": "alice",
            "pod": "nb-0",
            "owner_kind": "StatefulSet",
            "owner_name": "nb",
            "owner_is_controller": "true",
            "uid": "u1",
        },
    ),
    (
        "kube_pod_owner",
        {
            "namespace": "ml",
            "pod": "nightly-embed-29412960-z7d4k",
            "owner_kind": "Job",
            "owner_name": "nightly-embed-29412960",
            "owner_is_controller": "true",
            "uid": "u2",
        },
    ),
    (
        "kube_pod_owner",
        {
            "namespace": "scratch",
            "pod": "debug-gpu",
            "owner_kind": "<none>",
            "owner_name": "<none>",
            "owner_is_controller": "<none>",
            "uid": "u3",
        },
    ),
    # A pod that never held a GPU: not joined.
    (
        "kube_pod_owner",
        {
            "namespace": "chat",
            "pod": "redis-0",
            "owner_kind": "StatefulSet",
            "owner_name": "redis",
            "owner_is_controller": "true",
            "uid": "u9",
        },
    ),
    (
        "kube_replicaset_owner",
        {
            "namespace": "chat",
            "replicaset": "chat-x-7d9f8b6c5d",
            "owner_kind": "Deployment",
            "owner_name": "chat-x",
            "owner_is_controller": "true",
        },
    ),
    (
        "kube_pod_labels",
        {
            "namespace": "chat",
            "pod": "chat-x-7d9f8b6c5d-x2kqp",
            "uid": "u0",
            "label_app_kubernetes_io_name": "chat-x",
            "label_app_kubernetes_io_part_of": "chat-platform",
            "label_team": "chat-infra",
        },
    ),
    (
        "kube_pod_labels",
        {
            "namespace": "alice",
            "pod": "nb-0",
            "uid": "u1",
            "label_notebook_name": "nb",
            "label_app": "nb",
        },
    ),
    (
        "kube_pod_labels",
        {
            "namespace": "scratch",
            "pod": "debug-gpu",
            "uid": "u3",
            "label_app_kubernetes_io_name": "debug",
        },
    ),
    (
        "kube_pod_info",
        {
            "namespace": "chat",
            "pod": "chat-x-7d9f8b6c5d-x2kqp",
            "uid": "u0",
            "node": NODE,
            "priority_class": "production-serving",
            "created_by_kind": "ReplicaSet",
            "created_by_name": "chat-x-7d9f8b6c5d",
        },
    ),
]


def _labels(pairs: dict[str, object]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}"


def _openmetrics(path: Path) -> None:
    lines = []
    for series, field in (("DCGM_FI_DEV_GPU_UTIL", "util"), ("DCGM_FI_DEV_FB_USED", "mem")):
        lines.append(f"# TYPE {series} gauge")
        for gpu, (namespace, pod, container, util) in PODS.items():
            labels = _labels(
                {
                    "gpu": gpu,
                    "UUID": f"GPU-0000000{gpu}-aaaa-bbbb-cccc-dddddddddddd",
                    "Hostname": NODE,
                    "modelName": "NVIDIA H100 80GB HBM3",
                    "namespace": namespace,
                    "pod": pod,
                    "container": container,
                }
            )
            for m in range(MINUTES):
                value = util(m) if field == "util" else 30_000.0
                lines.append(f"{series}{labels} {value} {T0 + 60 * m:.3f}")
    for series in dict.fromkeys(s for s, _ in KSM):
        lines.append(f"# TYPE {series} gauge")
        for name, labels in KSM:
            if name == series:
                lines += [
                    f"{series}{_labels(labels)} 1.0 {T0 + 60 * m:.3f}" for m in range(MINUTES)
                ]
    path.write_text("\n".join(lines) + "\n# EOF\n")


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_tool("prometheus")
    require_tool("promtool")
    work = tmp_path_factory.mktemp("ksm")
    metrics = work / "metrics.om"
    _openmetrics(metrics)
    path = work / "s.duckdb"
    with serve_backfill(metrics, work) as url:
        store = Store(path)
        try:
            read(
                PrometheusSource(url, vocabulary="dcgm"),
                86400.0,
                store,
                bucket_for,
                clock=lambda: T0 + 60 * MINUTES + 60,
            )
        finally:
            store.close()
    return path


def test_kube_pod_owner_and_labels_are_joined_on_namespace_and_pod(stored: Path) -> None:
    rows = {d.subject: d for d in read_records(stored, Declaration)}
    assert {s: (d.kind, d.name, d.implies) for s, d in rows.items()} == {
        "pod:chat/chat-x-7d9f8b6c5d-x2kqp": ("Deployment", "chat/chat-x", "inference"),
        "pod:alice/nb-0": ("Notebook", "alice/nb", "interactive"),
        "pod:ml/nightly-embed-29412960-z7d4k": ("CronJob", "ml/nightly-embed", "batch"),
        "pod:scratch/debug-gpu": ("Pod", "scratch/debug-gpu", None),
    }
    assert all(d.source == "kube-state-metrics" and d.node == NODE for d in rows.values())
    chat = json.loads(rows["pod:chat/chat-x-7d9f8b6c5d-x2kqp"].attributes or "{}")
    assert chat == {
        "labels": {
            "app.kubernetes.io/name": "chat-x",
            "app.kubernetes.io/part-of": "chat-platform",
        },
        "owners": ["ReplicaSet/chat-x-7d9f8b6c5d", "Deployment/chat-x"],
        "priority_class": "production-serving",
    }


def test_the_analysis_shows_what_ksm_declared(stored: Path) -> None:
    doc = analyze([str(stored)], "7d")
    declared = {g["gpu"]: g["declared"] for g in doc["gpus"]}
    assert declared[0]["kind"] == "Deployment" and declared[0]["source"] == "kube-state-metrics"
    assert declared[1]["name"] == "alice/nb" and declared[1]["workload"] == "pod alice/nb-0"
    assert declared[3] == {
        "kind": "Pod",
        "name": "scratch/debug-gpu",
        "implies": None,
        "source": "kube-state-metrics",
        "workload": "pod scratch/debug-gpu",
    }


def test_sanitized_label_keys() -> None:
    assert label_key("label_app_kubernetes_io_managed_by") == "app.kubernetes.io/managed-by"
    assert label_key("label_ray_io_originated_from_crd") == "ray.io/originated-from-crd"
    assert label_key("label_serving_kserve_io_inferenceservice") == (
        "serving.kserve.io/inferenceservice"
    )
    assert label_key("label_notebook_name") == "notebook-name"
    assert label_key("label_team") is None and label_key("namespace") is None
