"""Google Cloud Storage and Azure Blob Storage for real (issue 26): publishing, compacting and
reading a fleet location on gcp-storage-emulator (PyPI) and Azurite (npm) on loopback, through
the filesystems users configure (``gs://``, ``az://``; endpoints and credentials as
docs/deploy.md documents them). S3 is tested against moto in tests/test_publish.py.

The servers are external tools: a test skips when one is not installed, unless CI demands it
(``AISCOPE_REQUIRE_TOOLS``: ``.ci/run`` installs both)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.publish import publish
from analyzer.analysis import analyze
from store import location as loc
from tests.conftest import require_tool, run_aiscope
from tests.test_publish import _store_with_rows

#: Azurite's well-known development account (public, in Microsoft's documentation).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
START = 1_780_000_000.0  # 2026-05-28T20:26:40Z


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(url: str, server: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers (an error status for an unauthenticated probe is an answer)
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                pytest.fail(f"{what} did not start")
            time.sleep(0.1)


def _stop(server: subprocess.Popen[bytes]) -> None:
    """Ctrl-C, as a person stops either server (Azurite ignores SIGTERM for 30 s and more)."""
    server.send_signal(signal.SIGINT)
    try:
        server.wait(5)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """gcp-storage-emulator on loopback with a bucket ``fleet``; the environment that points
    ``gs://`` at it."""
    tool = require_tool("gcp-storage-emulator")
    port = _free_port()
    log = (tmp_path_factory.mktemp("gcs") / "server.log").open("wb")
    server = subprocess.Popen(
        [tool, "start", "--host", "127.0.0.1", "--port", str(port), "--default-bucket", "fleet",
         "--in-memory"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _wait_for(f"http://127.0.0.1:{port}/storage/v1/b", server, "gcp-storage-emulator")
        yield {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}
    finally:
        _stop(server)
        log.close()


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Azurite's blob service on loopback with a container ``fleet``; the environment that
    points ``az://`` at it (a connection string, as the portal gives one)."""
    tool = require_tool("azurite-blob")
    port = _free_port()
    folder = tmp_path_factory.mktemp("azurite")
    log = (folder / "server.log").open("wb")
    server = subprocess.Popen(
        [tool, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(folder),
         "--silent", "--skipApiVersionCheck", "--loose"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    env = {
        "AZURE_STORAGE_CONNECTION_STRING": (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint};"
        )
    }
    try:
        _wait_for(f"{endpoint}?comp=list", server, "Azurite")
        with _environment(env):
            loc._filesystem(loc.parse("az://fleet")).create_dir("fleet")
        yield env
    finally:
        _stop(server)
        log.close()


class _environment:
    """Set variables for the block (the location layer reads ``os.environ``)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.old: dict[str, str | None] = {}

    def __enter__(self) -> None:
        self.old = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)

    def __exit__(self, *exc: object) -> None:
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _publish_read_compact(tmp_path: Path, url: str, env: dict[str, str]) -> None:
    """A node store published to ``url`` once its first day is over: the day goes out whole
    and its hour segments are removed (one object per table for the finished day), the next
    day's hours stay; the analysis read back from the location matches the store's. (One
    node and 15 hours: Azurite on a loaded machine takes about a second per request.)"""
    store = _store_with_rows(tmp_path / "s.duckdb", ["n1"], START, hours=15, step=300)
    target = loc.parse(url)
    with _environment(env):
        result = publish(store, target, START + 16 * 3600)  # the 29th, 12:26: the 28th is over
        files = [e.relpath for e in loc.list_files(target, "")]
    store.close()
    # 20:00 to 23:00 of the 28th, gpu and host samples: 8 hour segments written, 8 removed.
    assert (result.removed, result.remove_failures) == (8, 0)
    for table in ("gpu_samples", "host_samples"):
        whole = [f for f in files if f.startswith(f"table={table}/day=2026-05-28/node=n1/")]
        hours = [f for f in files if f.startswith(f"recent/table={table}/day=2026-05-28/")]
        assert (len(whole), hours) == (1, []), table
        assert any(f.startswith(f"recent/table={table}/day=2026-05-29/node=n1/") for f in files)

    docs = []
    for source in (url, str(store.path)):
        with _environment(env):
            doc: dict[str, Any] = analyze([source], since="7d")
        doc.pop("stores")
        doc["summary"]["coverage"].pop("stores")  # each input by name, as "stores" is
        docs.append(doc)
    assert docs[0] == docs[1]
    assert len(docs[0]["gpus"]) == 1
    # And through the CLI, as a cron job would: the location alone, read back.
    result = run_aiscope("analyze", "--store", url, "--format", "json", env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)["summary"]
    summary["coverage"].pop("stores")
    assert summary == docs[1]["summary"]


@pytest.mark.slow
def test_gcs_publish_compact_and_read(gcs: dict[str, str], tmp_path: Path) -> None:
    _publish_read_compact(tmp_path, "gs://fleet/aiscope", gcs)


@pytest.mark.slow
def test_azure_publish_compact_and_read(azurite: dict[str, str], tmp_path: Path) -> None:
    _publish_read_compact(tmp_path, "az://fleet/aiscope", azurite)


def test_endpoints_from_the_documented_variables() -> None:
    assert loc.gcs_options({}) == {}
    assert loc.gcs_options({"STORAGE_EMULATOR_HOST": "127.0.0.1:9023"}) == {
        "endpoint_override": "127.0.0.1:9023",
        "scheme": "http",
        "anonymous": True,
    }
    options = loc.azure_options(
        {
            "AZURE_STORAGE_CONNECTION_STRING": "DefaultEndpointsProtocol=http;AccountName=acct;"
            "AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:10000/acct;"
        }
    )
    assert options == {
        "account_name": "acct",
        "account_key": "a2V5",
        "blob_storage_scheme": "http",
        "blob_storage_authority": "127.0.0.1:10000",
        "dfs_storage_scheme": "http",
        "dfs_storage_authority": "127.0.0.1:10000",
    }
    named = loc.azure_options({"AZURE_STORAGE_ACCOUNT_NAME": "prod"})
    assert named == {"account_name": "prod", "account_key": None}
