"""Pod names from a (real, local) HTTP server that speaks the API server's pod list."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from agent.k8s import PodDirectory
from agent.store import Store
from analyzer.analysis import analyze
from store.schema import Pod, Process, ProcessSample
from tests.test_findings import T0, build_store

UID = "5d1b4e00-6f1d-4d6e-9a57-2c1f0f1e3a9b"


class _ApiServer(BaseHTTPRequestHandler):
    pods: ClassVar[dict[str, list[dict]]] = {}
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        node = self.path.split("spec.nodeName%3D", 1)[-1]
        body = json.dumps({"kind": "PodList", "items": self.pods.get(node, [])}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[str]:
    _ApiServer.pods = {
        "n1": [{"metadata": {"uid": UID, "namespace": "serving", "name": "chat-api-7d9f"}}]
    }
    _ApiServer.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ApiServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_pod_names_for_this_node_with_the_service_account_token(api: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cr3t\n")
    pods = PodDirectory("n1", api, token_path=token, clock=lambda: 123.0)
    records = pods.refresh()
    assert records == [Pod("n1", UID, "serving", "chat-api-7d9f", 123.0)]
    assert pods.lookup(UID).name == "chat-api-7d9f"
    path, auth = _ApiServer.seen[0]
    assert path == "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1" and auth == "Bearer s3cr3t"


def test_unreachable_api_keeps_uids_logs_once_and_counts(caplog) -> None:
    pods = PodDirectory("n1", "http://127.0.0.1:9", timeout_seconds=0.5)
    assert pods.refresh() == [] and pods.refresh() == []
    assert pods.lookup(UID) is None
    assert pods.snapshot() == ((), 2)
    assert sum("attributing by pod UID" in r.message for r in caplog.records) == 1


def test_not_in_a_cluster(monkeypatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert PodDirectory.in_cluster("n1") is None


def test_analyzer_names_pod_tenants(api: str, tmp_path: Path) -> None:
    """A pod holding a GPU idle is reported by namespace/name once the name is known."""
    cgroup = (
        f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{'a' * 64}.scope"
    )
    path = build_store(tmp_path / "s.duckdb", 180, {0: lambda m: (0.0, 20.0, 80.0)})
    store = Store(path)
    store.add(
        [
            Process(
                "n1",
                7,
                1007,
                "python3",
                "python3 -m vllm",
                "svc",
                cgroup,
                None,
                UID,
                "a" * 64,
                None,
                T0,
                T0 + 180 * 60,
            ),
            *[
                ProcessSample(T0 + m * 60, "n1", "GPU-00000000", 7, 1007, 20 << 30, 0.0)
                for m in range(180)
            ],
        ]
    )
    store.flush()
    doc = analyze([str(path)], since="1d")
    assert [f["holder"] for f in doc["findings"] if f["kind"] == "idle_held"] == [f"pod {UID}"]
    store.add(PodDirectory("n1", api).refresh())
    store.flush()
    store.close()
    doc = analyze([str(path)], since="1d")
    assert [f["holder"] for f in doc["findings"] if f["kind"] == "idle_held"] == [
        "pod serving/chat-api-7d9f"
    ]
