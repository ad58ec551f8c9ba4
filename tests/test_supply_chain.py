"""The supply chain (issue #27 §8): locks with hashes that cover pyproject's ranges, an SBOM that
is the image lock's, and a pip-audit probe that tells "no advisory source" from "audited"."""

from __future__ import annotations

import http.server
import importlib.util
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO

DEPLOY = REPO / "deploy"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, DEPLOY / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lock = _load("lock")
probe = _load("audit_probe")


def test_both_locks_pin_every_dependency_in_range_with_hashes() -> None:
    assert lock.check_lock(lock.IMAGE_LOCK, ()) == []
    assert lock.check_lock(lock.DEV_LOCK, ("dev",)) == []
    image = lock.pins(lock.IMAGE_LOCK)
    assert {"duckdb", "prometheus-client", "nvidia-ml-py", "setuptools"} <= set(image)
    assert all(hashes >= 1 for _, hashes in image.values())


def test_the_sbom_tool_is_locked_apart_from_the_dev_environment() -> None:
    """cyclonedx-py has its own hashed lock; the dev lock (the tests' environment) has none of its
    validation extras: every Ray daemon of the tests' cluster imported rfc3987-syntax through
    them (2.3 CPU-seconds each), and the head failed to start on a loaded runner."""
    assert lock.check_pins(lock.SBOM_TOOL_LOCK, lock.requirements_in(lock.SBOM_TOOL_IN)) == []
    assert "cyclonedx-bom" in lock.pins(lock.SBOM_TOOL_LOCK)
    dev = lock.pins(lock.DEV_LOCK)
    assert not {"cyclonedx-bom", "rfc3987-syntax"} & set(dev), sorted(dev)


def test_the_check_finds_a_missing_an_out_of_range_and_an_unhashed_pin(tmp_path: Path) -> None:
    text = lock.IMAGE_LOCK.read_text()
    broken = tmp_path / "requirements.lock"
    # duckdb moved out of its range, psutil dropped, typer's hashes removed
    text = text.replace("\nduckdb==", "\nduckdb==0.9.0\nduckdb-was==", 1)
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("psutil=="))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    lines = lines[:start] + lines[end:]
    lines = [
        line
        for i, line in enumerate(lines)
        if not (line.strip().startswith("--hash") and _owner(lines, i) == "typer")
    ]
    broken.write_text("\n".join(lines) + "\n")
    problems = " | ".join(lock.check_lock(broken, ()))
    assert "psutil is not locked" in problems
    assert "duckdb==0.9.0 is outside" in problems
    assert "typer has no hash" in problems


def _owner(lines: list[str], i: int) -> str:
    while lines[i].startswith(" "):
        i -= 1
    return lines[i].split("==")[0]


def test_the_sbom_lists_exactly_the_image_locks_pins() -> None:
    sbom = json.loads(lock.SBOM.read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    listed = {(c["name"].lower(), c["version"]) for c in sbom["components"]}
    pinned = {(n, v) for n, (v, _) in lock.pins(lock.IMAGE_LOCK).items()}
    assert listed == pinned
    assert "serialNumber" not in sbom and "timestamp" not in sbom["metadata"]  # reproducible


def test_the_dockerfile_installs_from_the_lock_with_hashes() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert "--require-hashes -r deploy/requirements.lock" in text
    assert "pip install --no-cache-dir --no-deps --no-build-isolation ." in text


class _Pypi(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/pypi/pip/24.0/json":
            body = json.dumps({"info": {}, "vulnerabilities": []}).encode()
            self.send_response(200)
        else:  # a mirror that serves packages but not the JSON API
            body = b"<html>not found</html>"
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def pypi() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pypi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_the_audit_probe_tells_a_source_from_none(pypi: str) -> None:
    assert probe.reachable(f"{pypi}/pypi/pip/24.0/json") is True
    assert probe.reachable(f"{pypi}/simple/pip/") is False  # 404
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pypi) as closed:
        port = closed.server_port
    assert probe.reachable(f"http://127.0.0.1:{port}/pypi/pip/24.0/json", 2.0) is False
