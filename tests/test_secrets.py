"""Secrets never echo (issue #27): one known secret passed through every flag and config key
that takes one, and every byte of output, log and written file searched for it.

The places a secret can be given: ``--prometheus URL`` (its userinfo and its query string, a
gateway's ``?apikey=``), ``--prometheus-bearer-token-file``, ``--prometheus-basic-auth
USER:PASSWORD_FILE``, ``--prometheus-header``; the ``[notify]`` keys ``webhook_url`` (its userinfo,
its query and the token that ends its path), ``webhook_url_file``, ``webhook_url_env``,
``smtp_password_file`` and ``smtp_password_env``; and the object-store credentials ``publish``
reads from ``AWS_SECRET_ACCESS_KEY``. Every command runs with ``--debug`` (debug logs and
tracebacks on), against servers that refuse, fail or are not there.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from store.masking import MASK
from tests.conftest import require_tool, run_aiscope
from tests.promserver import free_port, serve_backfill, store_to_openmetrics
from tests.test_findings import build_store

SECRET = "Zq7xS3cr3tW0rd9"


def _leaks(out: Path, *texts: str) -> list[str]:
    """Where the secret shows: in a text, or in any file written under ``out``."""
    found = [f"output {i}: {t[max(0, t.find(SECRET) - 80) :][:200]}" for i, t in enumerate(texts)]
    found = [f for f, t in zip(found, texts, strict=True) if SECRET in t]
    return found + [
        str(p) for p in out.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()
    ]


@contextmanager
def _server(status: int, body: bytes = b'{"status":"error","error":"no"}') -> Iterator[Any]:
    """Answers every request with ``status``; records each request's path and headers."""
    seen: list[tuple[str, dict[str, str]]] = []

    class Answer(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            seen.append((self.path, dict(self.headers.items())))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    """``in`` holds the secret files given to aiscope; ``out`` is where it may write."""
    given, out = tmp_path / "in", tmp_path / "out"
    given.mkdir()
    out.mkdir()
    (given / "token").write_text(SECRET + "\n")
    (given / "password").write_text(SECRET + "\n")
    return given, out


@pytest.mark.slow
def test_prometheus_secrets_never_echo(folders: tuple[Path, Path]) -> None:
    given, out = folders
    bearer = ["--prometheus-bearer-token-file", str(given / "token")]
    basic = ["--prometheus-basic-auth", f"reader:{given / 'password'}"]
    header = ["--prometheus-header", f"X-Api-Key: {SECRET}"]
    runs = [
        (400, ["analyze", *bearer, *header]),
        (400, ["analyze", *basic]),
        (400, ["plan", *bearer]),
        (400, ["report", "--out", str(out / "r.html"), *header]),
        (503, ["analyze", *bearer]),  # retried, then a failure
    ]
    outputs: list[str] = []
    for status, command in runs:
        with _server(status) as (port, seen):
            url = f"http://127.0.0.1:{port}/prom?apikey={SECRET}&org=7"
            done = run_aiscope("--debug", *command, "--prometheus", url)
        assert done.returncode != 0  # --debug: the traceback, then exit 1
        assert f"--prometheus http://127.0.0.1:{port}/prom?apikey={MASK}&org={MASK}" in done.stderr
        outputs += [done.stdout, done.stderr]
        # the gateway's key rides on every request, after the API path
        assert seen and all(path.startswith("/prom/api/v1/") for path, _ in seen)
        assert all(f"apikey={SECRET}" in path for path, _ in seen)
    gone = run_aiscope(
        "--debug", "analyze", "--prometheus", f"http://127.0.0.1:{free_port()}/?apikey={SECRET}"
    )
    userinfo = run_aiscope("analyze", "--prometheus", f"http://u:{SECRET}@127.0.0.1:9/")
    malformed = run_aiscope("analyze", "--prometheus", f"ftp://h/?apikey={SECRET}")
    assert gone.returncode == 1 and userinfo.returncode == 2 and malformed.returncode == 2
    for done in (gone, userinfo, malformed):
        outputs += [done.stdout, done.stderr]
    assert not _leaks(out, *outputs)


@pytest.mark.slow
def test_the_documents_source_shows_the_prometheus_url_masked(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    require_tool("prometheus")
    require_tool("promtool")
    _, out = folders
    store = build_store(tmp_path / "s.duckdb", 90, {0: lambda m: (0.9, 60.0, 500.0)})
    metrics = tmp_path / "metrics.om"
    store_to_openmetrics(store, metrics, "aiscope")
    with serve_backfill(metrics, tmp_path) as url:
        keyed = f"{url}/?apikey={SECRET}"
        doc = run_aiscope("--debug", "analyze", "--prometheus", keyed, "--format", "json")
        files = [str(out / f"r{suffix}") for suffix in (".json", ".html", ".md")]
        report = run_aiscope(
            "--debug", "report", "--prometheus", keyed, *(a for f in files for a in ("--out", f))
        )
    assert doc.returncode == 0 and report.returncode == 0, doc.stderr + report.stderr
    assert json.loads(doc.stdout)["source"]["prometheus"] == f"{url}/?apikey={MASK}"
    assert not _leaks(out, doc.stdout, doc.stderr, report.stdout, report.stderr)


def _notify_config(given: Path, lines: list[str]) -> Path:
    config = given / "aiscope.toml"
    base = ['from = "aiscope@example.org"', 'to = ["gpu-platform@example.org"]']
    config.write_text("\n".join(["[notify]", *base, *lines]) + "\n")
    return config


@pytest.mark.slow
def test_notify_secrets_never_echo(folders: tuple[Path, Path], tmp_path: Path) -> None:
    given, out = folders
    store = build_store(tmp_path / "s.duckdb", 60, {0: lambda m: (0.0, 30.0, 80.0)})
    outputs: list[str] = []
    with _server(404, b"no_service") as (port, seen):
        hook = f"http://hook:{SECRET}@127.0.0.1:{port}/services/T0/B0/{SECRET}?token={SECRET}"
        (given / "hook").write_text(hook + "\n")
        smtp = [
            'smtp_host = "127.0.0.1"',
            f"smtp_port = {free_port()}",
            'smtp_user = "aiscope"',
        ]
        configs = [
            ([f'webhook_url = "{hook}"'], {}),
            ([f'webhook_url_file = "{given / "hook"}"'], {}),
            (['webhook_url_env = "AISCOPE_TEST_HOOK"'], {"AISCOPE_TEST_HOOK": hook}),
            ([*smtp, f'smtp_password_file = "{given / "password"}"'], {}),
            ([*smtp, 'smtp_password_env = "AISCOPE_TEST_PW"'], {"AISCOPE_TEST_PW": SECRET}),
        ]
        for lines, env in configs:
            config = _notify_config(given, lines)
            state = ["--state", str(out / "notify.duckdb")]
            for dry in ([], ["--dry-run"]) if lines == configs[0][0] else ([],):
                args = ["--store", str(store), "--config", str(config), *state, *dry]
                done = run_aiscope("--debug", "notify", *args, env=env)
                assert done.returncode == 0 if dry else done.returncode != 0, done.stderr
                outputs += [done.stdout, done.stderr]
        # the webhook was reached, its userinfo sent as Basic credentials, not in the request line
        assert seen and all(path.startswith("/services/T0/B0/") for path, _ in seen)
        assert all(headers.get("Authorization", "").startswith("Basic ") for _, headers in seen)
    assert f"webhook http://{MASK}@127.0.0.1:{port}/services/T0/B0/{MASK}?token={MASK}" in "".join(
        outputs
    )
    assert not _leaks(out, *outputs)


def test_object_store_credentials_never_echo(folders: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = folders
    store = build_store(tmp_path / "s.duckdb", 30, {0: lambda m: (0.5, 40.0, 200.0)})
    env = {
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEEXAMPLE00",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "AWS_REGION": "us-east-1",
    }
    done = run_aiscope(
        "--debug", "publish", "--store", str(store), "--to", "s3://bucket/fleet", env=env
    )
    assert done.returncode != 0
    outputs = [done.stdout, done.stderr]
    for location in (f"s3://AKIAEXAMPLE:{SECRET}@bucket/fleet", f"az://c/p?sv=1&sig={SECRET}"):
        refused = run_aiscope("publish", "--store", str(store), "--to", location)
        assert refused.returncode == 2 and refused.stderr.startswith("aiscope: --to "), refused
        outputs += [refused.stdout, refused.stderr]
    assert not _leaks(out, *outputs)
