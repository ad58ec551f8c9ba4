"""``aiscope notify``: the weekly report and owner notices through a real SMTP server process
(aiosmtpd on loopback, STARTTLS with a certificate made here, AUTH) and a local webhook receiver.
No message leaves the machine."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import ipaddress
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, query, run_aiscope
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from analyzer.notices import Notice, NoticeRules, choose, told
from store.schema import NoticeSent

PASSWORD = "s3cret-for-tests"


def _certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (it is its own CA)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aiscope test SMTP")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "smtp.crt", directory / "smtp.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class Smtp:
    def __init__(self, port: int, out: Path, cert: Path) -> None:
        self.port, self.out, self.cert = port, out, cert

    def messages(self) -> list[tuple[dict[str, Any], email.message.EmailMessage]]:
        out = []
        for eml in sorted(self.out.glob("*.eml")):
            meta = json.loads(eml.with_suffix(".json").read_text())
            msg = email.message_from_bytes(eml.read_bytes(), policy=email.policy.default)
            out.append((meta, msg))
        return out


@pytest.fixture
def smtp(tmp_path: Path) -> Iterator[Smtp]:
    cert, key = _certificate(tmp_path)
    (tmp_path / "password").write_text(PASSWORD + "\n")
    out = tmp_path / "received"
    out.mkdir()
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "smtpserver.py"), "--cert", str(cert), "--key",
         str(key), "--user", "aiscope", "--password-file", str(tmp_path / "password"),
         "--out", str(out)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        line = server.stdout.readline() if server.stdout else ""
        assert line.startswith("PORT "), line
        yield Smtp(int(line.split()[1]), out, cert)
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(json.loads(body))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/services/T0/B0/token", received
    finally:
        server.shutdown()
        server.server_close()


def _config(tmp_path: Path, smtp: Smtp, hook: str | None, password: str = PASSWORD) -> Path:
    (tmp_path / "smtp-password").write_text(password)
    path = tmp_path / "aiscope.toml"
    lines = [
        "[notify]",
        'smtp_host = "127.0.0.1"',
        f"smtp_port = {smtp.port}",
        "starttls = true",
        'smtp_user = "aiscope"',
        f'smtp_password_file = "{tmp_path / "smtp-password"}"',
        f'smtp_ca_file = "{smtp.cert}"',
        'from = "aiscope@example.org"',
        'to = ["gpu-platform@example.org"]',
        'user_domain = "example.org"',
        "idle_held_hours = 4",
        "starved_gpu_hours = 8",
    ]
    if hook:
        lines.append(f'webhook_url = "{hook}"')
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def store(tmp_path: Path, demo_two_day_store: Path) -> Path:
    """A copy of the demo store: notify writes its notices_sent there."""
    copy = tmp_path / "fleet.duckdb"
    shutil.copy(demo_two_day_store, copy)
    return copy


def test_weekly_mail_webhook_and_owner_notices_once(
    tmp_path: Path, smtp: Smtp, webhook: tuple[str, list[dict[str, Any]]], store: Path
) -> None:
    hook, posts = webhook
    config = _config(tmp_path, smtp, hook)
    first = run_aiscope("notify", "--store", str(store), "--config", str(config))
    assert first.returncode == 0, first.stderr
    got = smtp.messages()
    assert all(meta["tls"] and meta["authenticated"] for meta, _ in got)
    weekly = [m for meta, m in got if meta["to"] == ["gpu-platform@example.org"]]
    assert len(weekly) == 1
    mail = weekly[0]
    assert mail["Subject"].startswith("aiscope weekly report: ")
    assert mail.get_content_type() == "multipart/mixed"  # the report, then its tables
    alternative = next(mail.iter_parts())
    parts = [p.get_content_type() for p in alternative.iter_parts()]
    assert parts == ["text/plain", "text/html"]  # the preferred (HTML) part last
    assert "aiscope weekly report" in mail.get_body(("plain",)).get_content()
    page = mail.get_body(("html",)).get_content()
    assert "<html" in page
    # the page refers to what the mail attaches, never to a JSON it does not carry
    files = {a.get_filename(): a.get_content() for a in mail.iter_attachments()}
    assert list(files) == ["gpus.csv", "findings.csv"]
    assert "Attached: gpus.csv (one row per GPU), findings.csv (one row per finding)." in page
    assert "JSON" not in page
    assert files["findings.csv"].startswith("kind,node,gpu,uuid,start,end,gpu_hours_lost,")
    assert len(files["gpus.csv"].splitlines()) == 1 + 36  # the demo's 36 GPUs
    # the owner of the job that holds a GPU with no compute hears about it, by name
    user = query(store, "SELECT user FROM processes WHERE slurm_job_id = '41009' LIMIT 1")[0][0]
    notices = {meta["to"][0]: m for meta, m in got if meta["to"] != ["gpu-platform@example.org"]}
    body = notices[f"{user}@example.org"].get_content()
    assert "slurm job 41009: held with no compute on 1 GPU(s) (gpu-node-04/6)" in body
    assert "no compute for" in body and "Fix: release the GPU" in body
    # the starved job's owner gets one message naming its GPUs, the evidence and the fix
    starved = [b.get_content() for b in notices.values() if "slurm job 41006" in b.get_content()]
    assert len(starved) == 1
    assert "gpu-node-04/0" in starved[0] and "DataLoader" in starved[0]
    # the webhook got Slack-compatible JSON
    assert posts and posts[0]["text"].startswith("aiscope weekly report: ")
    assert posts[0]["blocks"][0]["type"] == "header"
    rows = query(store, "SELECT count(*), count(DISTINCT finding_id) FROM notices_sent")[0]
    assert rows[0] >= len(notices) and rows[1] >= 6
    # a second run: the weekly report again, no notice twice
    second = run_aiscope("notify", "--store", str(store), "--config", str(config))
    assert second.returncode == 0, second.stderr
    after = smtp.messages()
    assert len(after) == len(got) + 1
    assert after[-1][0]["to"] == ["gpu-platform@example.org"]
    assert "told before: not sent again" in second.stdout


def test_a_cut_table_in_the_mail_points_at_its_attachment(demo_two_day_store: Path) -> None:
    """More findings than the tables show: the mailed forms send the reader to the attached
    findings.csv (which has every one), not to "the JSON" (issue 24)."""
    from aiscope import notify
    from analyzer.analysis import analyze
    from report import TOP_N

    doc = analyze([str(demo_two_day_store)], "7d")
    doc["findings"] = [f for f in doc["findings"] for _ in range(TOP_N)]
    text, page, files = notify._report_forms(doc)
    kinds = {f["kind"] for f in doc["findings"]}
    assert "JSON" not in page and "report.json" not in text
    assert "all of them in the attached findings.csv" in page
    assert "all of them in the attached findings.csv" in text
    findings = dict(files)["findings.csv"].splitlines()
    assert len(findings) == 1 + len(doc["findings"])
    assert {line.split(",")[0] for line in findings[1:]} == kinds
    # the report written by `aiscope report`, which attaches nothing, still names the JSON
    from report.html import render

    assert "see the JSON" in render(doc)


def test_dry_run_sends_and_records_nothing(tmp_path: Path, smtp: Smtp, store: Path) -> None:
    config = _config(tmp_path, smtp, None)
    out = run_aiscope("notify", "--store", str(store), "--config", str(config), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "would mail the weekly report to gpu-platform@example.org" in out.stdout
    assert "would tell" in out.stdout and "slurm job 41009" in out.stdout
    assert smtp.messages() == []
    assert PASSWORD not in out.stdout + out.stderr
    tables = query(store, "SELECT count(*) FROM duckdb_tables() WHERE table_name='notices_sent'")
    assert tables == [(0,)]


def test_refused_login_is_one_line_and_exit_1(tmp_path: Path, smtp: Smtp, store: Path) -> None:
    config = _config(tmp_path, smtp, None, password="wrong")
    out = run_aiscope("notify", "--store", str(store), "--config", str(config), "--no-notices")
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0
    assert out.stderr.startswith(f"aiscope: SMTP 127.0.0.1:{smtp.port}: login refused")
    assert "wrong" not in out.stderr  # the password is never echoed
    assert smtp.messages() == []


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('smtp_host = "h"\nfrom = "a@b.c"\nto = "t@b.c"\nsmtp_user = "u"', "without smtp_pass"),
        ('smtp_host = "h"\nfrom = "a@b.c"\nto = "t@b.c"\nsmtp_password = "x"', "unknown key"),
        ('smtp_host = "h"\nto = "t@b.c"', "notify.from"),
        ('webhook_url_env = "NOPE_NOT_SET"', "NOPE_NOT_SET is not set"),
        (
            'smtp_host = "h"\nfrom = "a@b.c"\nto = "t@b.c"\nsmtp_user = "u"\nstarttls = false\n'
            'smtp_password_env = "HOME"',
            "in clear",
        ),
    ],
)
def test_bad_settings_are_bad_input(tmp_path: Path, store: Path, table: str, message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(f"[notify]\n{table}\n")
    out = run_aiscope("notify", "--store", str(store), "--config", str(config))
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and out.stderr.startswith("aiscope: ")


def _finding(**kw: Any) -> dict[str, Any]:
    base = {
        "kind": "idle_held",
        "node": "n1",
        "gpu": 0,
        "uuid": "GPU-1",
        "start": "2026-11-16T00:00:00Z",
        "end": "2026-11-16T10:00:00Z",
        "gpu_hours_lost": 10.0,
        "holder": "slurm job 7",
        "user": "ann",
        "idle_held_seconds": 36000.0,
        "evidence": ["held"],
    }
    return {**base, **kw}


def _sent(n: Notice) -> NoticeSent:
    return NoticeSent(n.finding_id, n.kind, n.subject, n.node, n.uuid, n.start_ts, n.end_ts,
                      "ann@x", "email", 0.0)  # fmt: skip


def test_a_finding_that_goes_on_is_the_one_told_and_a_new_stretch_is_not() -> None:
    rules = NoticeRules(idle_held_hours=4, starved_gpu_hours=8)
    first = choose({"findings": [_finding()]}, {}, rules)
    assert len(first) == 1
    sent = [_sent(first[0])]
    # a week later the window starts mid-stretch: the same finding
    slid = choose({"findings": [_finding(start="2026-11-16T06:00:00Z",
                                         end="2026-11-17T00:00:00Z")]}, {}, rules)  # fmt: skip
    assert told(slid[0], sent)
    # the same holder idles again after it computed: a new finding
    later = choose({"findings": [_finding(start="2026-11-18T00:00:00Z",
                                          end="2026-11-18T09:00:00Z")]}, {}, rules)  # fmt: skip
    assert not told(later[0], sent)
    # under the threshold: no notice; a starved job counts its GPUs together
    assert choose({"findings": [_finding(idle_held_seconds=3600.0)]}, {}, rules) == []
    starved = [
        _finding(kind="starved", job="slurm job 9", cause="input_cpu", gpu=i, uuid=f"G{i}",
                 gpu_hours_lost=3.0)
        for i in range(3)
    ]  # fmt: skip
    picked = choose({"findings": starved}, {"slurm job 9": "bo"}, rules)
    assert [n.user for n in picked] == ["bo"] * 3
    assert "DataLoader" in picked[0].fix
    assert choose({"findings": starved[:2]}, {}, rules) == []


def test_deploy_files_carry_notify_as_a_secret_and_use_real_flags() -> None:
    import yaml

    deploy = REPO / "deploy"
    help_text = run_aiscope("notify", "--help").stdout
    cron = yaml.safe_load((deploy / "kubernetes" / "notify-cronjob.yaml").read_text())
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    command = " ".join(pod["containers"][0]["args"])
    flags = {w.rstrip(";") for w in command.replace("=", " ").split() if w.startswith("--")}
    assert flags and all(f in help_text for f in flags), flags
    assert {"name": "notify", "secret": {"secretName": "aiscope-notify", "defaultMode": 0o400}} in (
        pod["volumes"]
    )
    secret = yaml.safe_load((deploy / "kubernetes" / "notify-secret.yaml").read_text())
    assert "[notify]" in secret["stringData"]["notify.toml"]
    unit = (deploy / "systemd" / "aiscope-notify.service").read_text()
    assert "LoadCredential=smtp-password:" in unit
    assert all(f in help_text for f in ("--notify-config", "--state", "--no-report"))


def test_systemd_notify_units_verify() -> None:
    from conftest import require_tool

    analyze = require_tool("systemd-analyze")
    systemd = REPO / "deploy" / "systemd"
    result = subprocess.run(
        [analyze, "verify", systemd / "aiscope-notify.service", systemd / "aiscope-notify.timer"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "aiscope-notify" not in result.stderr, result.stderr


def test_addresses_by_user_workload_or_team() -> None:
    from aiscope.notify import NotifyConfig

    cfg = NotifyConfig(
        smtp_host="h",
        sender="a@b.c",
        to=("platform@b.c",),
        owners={"ann": "ann@lab.c", "pod ml/x": "oncall@b.c", "vision": "vision@b.c"},
        user_domain="b.c",
    )
    base = choose({"findings": [_finding()]}, {}, NoticeRules())[0]
    assert cfg.address(base) == "ann@lab.c"
    import dataclasses

    team = dataclasses.replace(base, user="zed", owner="vision")
    assert cfg.address(team) == "vision@b.c"
    pod = dataclasses.replace(base, user=None, subject="pod ml/x")
    assert cfg.address(pod) == "oncall@b.c"
    assert cfg.address(dataclasses.replace(base, user="zed")) == "zed@b.c"
    nobody = dataclasses.replace(base, user=None, subject="unit u")
    assert cfg.address(nobody) is None


def test_a_refusing_webhook_names_the_server_not_its_token(tmp_path: Path, store: Path) -> None:
    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b"no_service")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/services/T0/B0/sEcReTtOkEn"
        (tmp_path / "hook").write_text(url)
        config = tmp_path / "hook.toml"
        config.write_text(f'[notify]\nwebhook_url_file = "{tmp_path / "hook"}"\n')
        out = run_aiscope("notify", "--store", str(store), "--config", str(config))
    finally:
        server.shutdown()
        server.server_close()
    assert out.returncode == 1
    assert "HTTP 404 no_service" in out.stderr and "sEcReTtOkEn" not in out.stderr
