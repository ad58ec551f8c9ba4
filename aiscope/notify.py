"""``aiscope notify``: the weekly report by email and to a chat webhook, and owner notices.

The one module that speaks SMTP (:mod:`smtplib`) and posts to webhooks. Settings come from the
``[notify]`` table of the config file; secrets (the SMTP password, the webhook URL, which carries
its token) come from a file or an environment variable named there, never from the command line.
The password is sent only over TLS: STARTTLS on the submission port (587) or implicit TLS (465),
the server's certificate verified against the system's CAs or ``smtp_ca_file``.

The weekly mail is ``multipart/alternative``: the text form of the report first, the HTML page
as the preferred part. The webhook gets Slack's ``{"text": ..., "blocks": [...]}``, which
Mattermost, Rocket.Chat and Teams' incoming webhooks also accept (``text`` alone for Teams).
Owner notices (:mod:`analyzer.notices`) go to each owner's address, at most once per finding:
what was told is kept in the store's ``notices_sent`` table, written in one short transaction
after the messages went out.
"""

from __future__ import annotations

import base64
import json
import math
import os
import smtplib
import ssl
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from pathlib import Path
from typing import Any

from analyzer.notices import Notice, NoticeRules, job_causes
from store.errors import BadInput, Failure
from store.masking import mask_url
from store.schema import NoticeSent

GIB = float(1 << 30)


class NotifyConfigError(BadInput):
    """A bad ``[notify]`` setting (exit 2); the message names the key and the file."""


class DeliveryError(Failure):
    """The SMTP server or the webhook refused or could not be reached (exit 1)."""


@dataclass(frozen=True, slots=True)
class NotifyConfig:
    """The ``[notify]`` table, validated; secrets already read."""

    smtp_host: str | None = None
    smtp_port: int = 587
    starttls: bool = True
    smtp_tls: bool = False  # implicit TLS (port 465) instead of STARTTLS
    smtp_user: str | None = None
    smtp_password: str | None = field(default=None, repr=False)
    smtp_ca_file: Path | None = None
    sender: str | None = None
    to: tuple[str, ...] = ()
    webhook_url: str | None = field(default=None, repr=False)
    webhook_ca_file: Path | None = None
    rules: NoticeRules = field(default_factory=NoticeRules)
    owners: Mapping[str, str] = field(default_factory=dict)  # user or workload -> address
    user_domain: str | None = None
    timeout_seconds: float = 30.0

    @property
    def email(self) -> bool:
        return self.smtp_host is not None

    def address(self, notice: Notice) -> str | None:
        """Where a notice goes: the owners map (by user, else by workload, else by the owner
        ``owners[]`` accounts it to: a team, account or namespace), else the user at
        ``user_domain``; ``None`` when the owner is not known (the platform team is told)."""
        for key in (notice.user, notice.subject, notice.owner):
            if key and key in self.owners:
                return self.owners[key]
        if notice.user and self.user_domain:
            return f"{notice.user}@{self.user_domain}"
        return None


_KEYS = {
    "smtp_host", "smtp_port", "starttls", "smtp_tls", "smtp_user", "smtp_password_file",
    "smtp_password_env", "smtp_ca_file", "from", "to", "webhook_url", "webhook_url_file",
    "webhook_url_env", "webhook_ca_file", "idle_held_hours", "starved_gpu_hours", "owners",
    "user_domain", "timeout_seconds",
}  # fmt: skip


def load_config(path: Path | None, env: Mapping[str, str] = os.environ) -> NotifyConfig:
    """The ``[notify]`` table of ``path``; :class:`NotifyConfigError` naming a bad key."""
    if path is None:
        raise NotifyConfigError("notify needs --config FILE with a [notify] table")
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise NotifyConfigError(f"--config {path}: cannot read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise NotifyConfigError(f"--config {path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise NotifyConfigError(f"--config {path}: not a text file (a TOML config)") from None
    table = data.get("notify")
    if not isinstance(table, dict):
        raise NotifyConfigError(f"--config {path}: no [notify] table (see docs/deploy.md)")
    where = f"{path}: notify"
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise NotifyConfigError(
            f"{where}.{unknown[0]}: unknown key; known: {', '.join(sorted(_KEYS))}"
        )
    return _parse(table, where, env)


def _parse(t: dict[str, Any], where: str, env: Mapping[str, str]) -> NotifyConfig:
    cfg = NotifyConfig(
        smtp_host=_str(t, "smtp_host", where),
        smtp_port=_port(t, where),
        starttls=_bool(t, "starttls", where, True),
        smtp_tls=_bool(t, "smtp_tls", where, False),
        smtp_user=_str(t, "smtp_user", where),
        smtp_password=_secret(t, "smtp_password", where, env),
        smtp_ca_file=_file(t, "smtp_ca_file", where),
        sender=_str(t, "from", where),
        to=_addresses(t, where),
        webhook_url=_secret(t, "webhook_url", where, env, plain=True),
        webhook_ca_file=_file(t, "webhook_ca_file", where),
        rules=NoticeRules(
            idle_held_hours=_num(t, "idle_held_hours", where, 4.0),
            starved_gpu_hours=_num(t, "starved_gpu_hours", where, 8.0),
        ),
        owners=_owners(t, where),
        user_domain=_str(t, "user_domain", where),
        timeout_seconds=_num(t, "timeout_seconds", where, 30.0),
    )
    _check(cfg, where)
    return cfg


def _check(cfg: NotifyConfig, where: str) -> None:
    if cfg.smtp_host is None and cfg.webhook_url is None:
        raise NotifyConfigError(f"{where}: set smtp_host or webhook_url (nowhere to send)")
    if cfg.email and (cfg.sender is None or "@" not in cfg.sender):
        raise NotifyConfigError(f"{where}.from: an address like aiscope@example.com is required")
    if cfg.email and not cfg.to:
        raise NotifyConfigError(f"{where}.to: the platform team's address(es) are required")
    if cfg.smtp_user and not (cfg.starttls or cfg.smtp_tls):
        raise NotifyConfigError(
            f"{where}: smtp_user is set but neither starttls nor smtp_tls: the password would "
            "cross the network in clear; enable one"
        )
    if cfg.smtp_user and cfg.smtp_password is None:
        raise NotifyConfigError(
            f"{where}: smtp_user is set without smtp_password_file or smtp_password_env"
        )
    if cfg.webhook_url and not _http_url(cfg.webhook_url):  # "http://" has no host
        raise NotifyConfigError(f"{where}.webhook_url: expected an http(s) URL with a host")


def _http_url(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _str(t: dict[str, Any], key: str, where: str) -> str | None:
    value = t.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise NotifyConfigError(f"{where}.{key}: expected a non-empty string")
    return value.strip() if isinstance(value, str) else None


def _num(t: dict[str, Any], key: str, where: str, default: float) -> float:
    value = t.get(key, default)
    bad = isinstance(value, bool) or not isinstance(value, int | float)
    if bad or not (math.isfinite(value) and value > 0):  # nan passed "<= 0" and never matched
        raise NotifyConfigError(f"{where}.{key}: expected a positive number (got {value!r})")
    return float(value)


def _port(t: dict[str, Any], where: str) -> int:
    value = _num(t, "smtp_port", where, 587)
    if not (value.is_integer() and value <= 65535):
        raise NotifyConfigError(f"{where}.smtp_port: expected a port, 1-65535 (got {value:g})")
    return int(value)


def _bool(t: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = t.get(key, default)
    if not isinstance(value, bool):
        raise NotifyConfigError(f"{where}.{key}: expected true or false (got {value!r})")
    return value


def _file(t: dict[str, Any], key: str, where: str) -> Path | None:
    text = _str(t, key, where)
    if text is None:
        return None
    if not Path(text).is_file():
        raise NotifyConfigError(f"{where}.{key}: no such file {text}")
    return Path(text)


def _secret(
    t: dict[str, Any], name: str, where: str, env: Mapping[str, str], plain: bool = False
) -> str | None:
    """``NAME_file`` (read, stripped) or ``NAME_env`` (a variable's name); ``NAME`` itself only
    where ``plain`` allows it (a webhook URL kept in a root-only config file)."""
    path, var = _str(t, f"{name}_file", where), _str(t, f"{name}_env", where)
    if path is not None:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise NotifyConfigError(
                f"{where}.{name}_file: cannot read {path} ({exc.strerror})"
            ) from None
        except UnicodeDecodeError:
            raise NotifyConfigError(f"{where}.{name}_file: {path} is not a text file") from None
    if var is not None:
        if not env.get(var):
            raise NotifyConfigError(f"{where}.{name}_env: the variable {var} is not set")
        return env[var]
    return _str(t, name, where) if plain else None


def _addresses(t: dict[str, Any], where: str) -> tuple[str, ...]:
    value = t.get("to", [])
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) and "@" in v for v in values):
        raise NotifyConfigError(f"{where}.to: expected an address or a list of addresses")
    return tuple(values)


def _owners(t: dict[str, Any], where: str) -> dict[str, str]:
    value = t.get("owners", {})
    if not isinstance(value, dict) or not all(
        isinstance(v, str) and "@" in v for v in value.values()
    ):
        raise NotifyConfigError(f'{where}.owners: expected a table of name = "address"')
    return dict(value)


# -- messages ------------------------------------------------------------------------------------


#: What the weekly mail attaches, by table (:mod:`report.export`): the forms refer to these
#: for the rows their tables leave out (a mail said "see the JSON" and attached none).
MAIL_ATTACHMENTS = {"gpus": "gpus.csv", "findings": "findings.csv"}

#: The weekly report as mailed: its text form, its HTML page, and the attachments (name, CSV).
ReportForms = tuple[str, str, tuple[tuple[str, str], ...]]


def weekly_mail(
    cfg: NotifyConfig,
    doc: dict[str, Any],
    text: str,
    html: str,
    attachments: tuple[tuple[str, str], ...] = (),
) -> EmailMessage:
    """The weekly report: the text form, with the HTML page as the preferred alternative, and
    the ``attachments`` (name, CSV text) the two forms refer to."""
    msg = _message(cfg, list(cfg.to), f"aiscope weekly report: {headline(doc)}")
    msg.set_content(text)
    msg.add_alternative(html, subtype="html")
    for name, content in attachments:
        msg.add_attachment(content.encode("utf-8"), "text", "csv", filename=name)
    return msg


def headline(doc: dict[str, Any]) -> str:
    """One line: the window and the useful / idle / starved / idle-held shares."""
    s = doc.get("summary", {})
    shares = s.get("shares", {})
    start, end = doc["window"]["start"][:10], doc["window"]["end"][:10]
    parts = [f"{start} to {end}", f"{s.get('gpus', len(doc.get('gpus', [])))} GPUs"]
    parts += [
        f"{name.replace('_', '-')} {shares[name]:.0%}"
        for name in ("useful", "idle", "starved", "idle_held")
        if isinstance(shares.get(name), int | float)
    ]
    return ", ".join(parts)


def webhook_report(doc: dict[str, Any], link: str | None = None) -> dict[str, Any]:
    """The weekly report for a chat channel: the headline and the top actions."""
    actions = doc.get("summary", {}).get("top_actions", [])
    lines = [f"• {a['action']}: {a['gpu_hours']:,.0f} GPU-hours" for a in actions]
    text = f"aiscope weekly report: {headline(doc)}"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": "aiscope weekly report"}},
        {"type": "section", "text": {"type": "mrkdwn", "text": headline(doc)}},
    ]
    if lines:
        body = "*Top actions*\n" + "\n".join(lines)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": body}})
        text += "\n" + "\n".join(lines)
    if link:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": link}]})
    return {"text": text, "blocks": blocks}


def notice_text(owner: str, notices: list[Notice]) -> str:
    """The body of one owner's message: per workload, its GPUs, the evidence of its costliest
    finding and the fix."""
    by_subject: dict[str, list[Notice]] = {}
    for n in notices:
        by_subject.setdefault(n.subject, []).append(n)
    lines = [
        f"Hello {owner},",
        "",
        f"aiscope found something to act on for {', '.join(by_subject)}.",
    ]
    for subject, ns in by_subject.items():
        worst = max(ns, key=lambda n: n.gpu_hours)
        gpus = ", ".join(f"{n.node}/{n.gpu}" for n in ns)
        what = "held with no compute" if worst.kind == "idle_held" else "starved (waiting)"
        costs = [n.cost for n in ns if n.cost is not None]
        cost = f", cost {sum(costs):,.2f}" if costs else ""
        hours = sum(n.gpu_hours for n in ns)
        lines += [
            "",
            f"* {subject}: {what} on {len(ns)} GPU(s) ({gpus}), {hours:.1f} GPU-hours lost{cost}",
            *(f"    {e}" for e in _evidence(worst, ns)),
            f"    Fix: {worst.fix}.",
        ]
    lines += ["", "You get this once per finding. Details: aiscope job <id>."]
    return "\n".join(lines)


def _evidence(worst: Notice, ns: list[Notice]) -> list[str]:
    """The costliest finding's evidence, with its one GPU's split by cause replaced by the
    workload's over all the GPUs told about (the figure the report and ``aiscope job`` show)."""
    if worst.kind != "starved" or len(ns) < 2:
        return list(worst.evidence)
    total = ", ".join(f"{c} {h:.1f} GPU-h" for c, h in job_causes(ns) if h > 0)
    line = f"by cause, over its {len(ns)} GPUs: {total}"
    return [line if e.startswith("by cause: ") else e for e in worst.evidence]


def notice_mail(cfg: NotifyConfig, to: str, owner: str, notices: list[Notice]) -> EmailMessage:
    gpus = len({(n.node, n.gpu) for n in notices})
    kinds = sorted({"idle GPUs" if n.kind == "idle_held" else "a starved job" for n in notices})
    subject = f"aiscope: {' and '.join(kinds)} ({gpus} GPU{'s' if gpus > 1 else ''}) for {owner}"
    msg = _message(cfg, [to], subject)
    msg.set_content(notice_text(owner, notices))
    return msg


def _message(cfg: NotifyConfig, to: list[str], subject: str) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = cfg.sender or "aiscope"
    msg["To"] = ", ".join(to)
    msg["Subject"] = subject
    msg["Date"] = formatdate(usegmt=True)
    msg["Message-ID"] = make_msgid(domain=(cfg.sender or "aiscope@localhost").split("@")[-1])
    msg["Auto-Submitted"] = "auto-generated"  # RFC 3834: no vacation replies
    return msg


# -- delivery ------------------------------------------------------------------------------------


class Mailer:
    """One SMTP session for a run's messages; TLS and login as configured."""

    def __init__(self, cfg: NotifyConfig) -> None:
        self.cfg = cfg
        self._smtp: smtplib.SMTP | None = None

    def _context(self) -> ssl.SSLContext:
        ca = self.cfg.smtp_ca_file
        return ssl.create_default_context(cafile=str(ca) if ca else None)

    def _open(self) -> smtplib.SMTP:
        cfg, host = self.cfg, self.cfg.smtp_host or ""
        smtp: smtplib.SMTP
        if cfg.smtp_tls:
            smtp = smtplib.SMTP_SSL(
                host, cfg.smtp_port, timeout=cfg.timeout_seconds, context=self._context()
            )
        else:
            smtp = smtplib.SMTP(host, cfg.smtp_port, timeout=cfg.timeout_seconds)
            smtp.ehlo()
            if cfg.starttls:
                if not smtp.has_extn("starttls"):
                    smtp.quit()
                    raise DeliveryError(
                        f"SMTP {host}:{cfg.smtp_port}: the server does not offer STARTTLS "
                        "(set starttls = false only for a relay on this host)"
                    )
                smtp.starttls(context=self._context())
                smtp.ehlo()
        if cfg.smtp_user:
            smtp.login(cfg.smtp_user, cfg.smtp_password or "")
        return smtp

    def send(self, msg: EmailMessage) -> None:
        where = f"SMTP {self.cfg.smtp_host}:{self.cfg.smtp_port}"
        try:
            if self._smtp is None:
                self._smtp = self._open()
            self._smtp.send_message(msg)
        except smtplib.SMTPAuthenticationError as exc:
            raise DeliveryError(
                f"{where}: login refused for {self.cfg.smtp_user} ({exc.smtp_code})"
            ) from None
        except (smtplib.SMTPException, ssl.SSLError, OSError) as exc:
            raise DeliveryError(f"{where}: {' '.join(str(exc).split())}") from None

    def close(self) -> None:
        if self._smtp is not None:
            try:
                self._smtp.quit()
            except (smtplib.SMTPException, OSError):
                self._smtp.close()
            self._smtp = None


def post_webhook(cfg: NotifyConfig, payload: dict[str, Any]) -> None:
    """POST ``payload`` as JSON; :class:`DeliveryError` with the server's answer on failure.
    A ``user:password@`` in the URL is sent as Basic credentials (urllib would take it for part
    of the host name), and every message shows the URL masked."""
    url, authorization = _split_userinfo(cfg.webhook_url or "")
    headers = {"Content-Type": "application/json", "User-Agent": "aiscope-notify"}
    if authorization:
        headers["Authorization"] = authorization
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers=headers, method="POST"
    )
    ca = cfg.webhook_ca_file
    context = ssl.create_default_context(cafile=str(ca) if ca else None)
    shown = mask_url(
        cfg.webhook_url or "", webhook=True
    )  # userinfo, query and the token in the path: masked
    try:
        with urllib.request.urlopen(request, timeout=cfg.timeout_seconds, context=context) as r:
            r.read()
    except urllib.error.HTTPError as exc:
        body = exc.read(200).decode(errors="replace").strip()
        raise DeliveryError(f"webhook {shown}: HTTP {exc.code} {body}".strip()) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:  # ValueError: http.client's
        reason = getattr(exc, "reason", exc)  # InvalidURL, whose text is the URL
        if isinstance(exc, ValueError):
            reason = "not a URL urllib can request"
        raise DeliveryError(f"webhook {shown}: {reason}") from None


def _split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without its ``user:password@``, and that as a Basic ``Authorization`` value."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
    basic = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    return urllib.parse.urlunsplit(parts._replace(netloc=host)), basic


# -- one run -------------------------------------------------------------------------------------


@dataclass
class Outbox:
    """What a run sends: the weekly mail, the webhook posts, and each owner's notices."""

    report_mail: EmailMessage | None = None
    posts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    notices: list[tuple[str, str, list[Notice]]] = field(default_factory=list)  # to, owner, ..


def plan(
    cfg: NotifyConfig,
    doc: dict[str, Any],
    fresh: list[Notice],
    report: ReportForms | None,
) -> Outbox:
    """The messages for ``doc`` (``report``: its text and HTML forms, when the weekly report is
    sent) and the notices not told before, grouped by where they go."""
    box = Outbox()
    if report is not None:
        if cfg.email:
            box.report_mail = weekly_mail(cfg, doc, *report)
        if cfg.webhook_url:
            box.posts.append(("the weekly report", webhook_report(doc)))
    groups: dict[tuple[str, str], list[Notice]] = {}
    for n in fresh:
        owner = n.user or n.subject
        address = cfg.address(n)
        if cfg.email:
            # An owner without a known address: the platform team is told instead.
            to = address or ", ".join(cfg.to)
            groups.setdefault((to, owner), []).append(n)
        else:
            groups.setdefault(("webhook", owner), []).append(n)
    box.notices = [(to, owner, ns) for (to, owner), ns in groups.items()]
    return box


def deliver(
    cfg: NotifyConfig,
    box: Outbox,
    record: Callable[[list[NoticeSent]], None],
    say: Callable[[str], None],
    now: Callable[[], float] = time.time,
) -> None:
    """Send everything in ``box``; each owner's notices are recorded right after they went out,
    so a failure later in the run never makes them go out twice."""
    mailer = Mailer(cfg) if cfg.email else None
    try:
        if box.report_mail is not None and mailer is not None:
            mailer.send(box.report_mail)
            say(f"mailed the weekly report to {box.report_mail['To']}")
        for what, payload in box.posts:
            post_webhook(cfg, payload)
            say(f"posted {what} to the webhook")
        for to, owner, notices in box.notices:
            if to == "webhook":
                post_webhook(cfg, {"text": notice_text(owner, notices)})
            elif mailer is not None:
                mailer.send(notice_mail(cfg, to, owner, notices))
            record(
                [_sent(n, to, "webhook" if to == "webhook" else "email", now()) for n in notices]
            )
            say(f"told {owner} ({to}) about {len(notices)} finding(s)")
    finally:
        if mailer is not None:
            mailer.close()


def _sent(n: Notice, to: str, channel: str, ts: float) -> NoticeSent:
    return NoticeSent(
        n.finding_id, n.kind, n.subject, n.node, n.uuid, n.start_ts, n.end_ts, to, channel, ts
    )


def dry_run(box: Outbox, say: Callable[[str], None]) -> None:
    """Print what :func:`deliver` would send."""
    if box.report_mail is not None:
        say(
            f"would mail the weekly report to {box.report_mail['To']}: {box.report_mail['Subject']}"
        )
        files = [part.get_filename() for part in box.report_mail.iter_attachments()]
        if files:
            say(f"  attached: {', '.join(str(f) for f in files)}")
    for what, payload in box.posts:
        say(f"would post {what} to the webhook: {payload['text'].splitlines()[0]}")
    for to, owner, notices in box.notices:
        say(f"would tell {owner} ({to}) about {len(notices)} finding(s):")
        for line in notice_text(owner, notices).splitlines()[3:]:
            say(f"  {line}")


# -- state ---------------------------------------------------------------------------------------


def record_sent(path: Path, rows: list[NoticeSent], wait_seconds: float = 10.0) -> None:
    """Append ``rows`` to the store's ``notices_sent`` in one short read-write attach (created
    on first use), retrying while an agent holds the file for a flush."""
    from agent.store import Store, StoreLocked  # noqa: PLC0415

    if not rows:
        return
    deadline = time.monotonic() + wait_seconds
    store = Store(path, extra_records=(NoticeSent,))
    try:
        while True:
            try:
                store.write_now(rows)
                return
            except StoreLocked:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
    finally:
        store.close()


def check_state(path: Path, wait_seconds: float = 10.0) -> None:
    """The ``--state`` store can record the notices about to be sent: a notice sent and then
    not recorded would be sent again on every run. A store not made yet needs a writable
    directory (it is created only by the first notice recorded)."""
    from agent.store import Store, StoreLocked  # noqa: PLC0415

    if not path.exists():
        if not (path.parent.is_dir() and os.access(path.parent, os.W_OK)):
            raise BadInput(f"--state {path}: cannot create the store there (no writable directory)")
        return
    deadline = time.monotonic() + wait_seconds
    store = Store(path, extra_records=(NoticeSent,))
    try:
        while True:
            try:
                store.check_writable()
                return
            except StoreLocked:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
    finally:
        store.close()


def sent_before(path: Path, wait_seconds: float = 10.0) -> list[NoticeSent]:
    from store.storefile import read_records  # noqa: PLC0415

    if not path.exists():  # a --state store of its own, before its first notice
        return []
    rows: list[NoticeSent] = read_records(path, NoticeSent, wait_seconds)
    return rows


def run(
    cfg: NotifyConfig,
    doc: dict[str, Any],
    users: dict[str, str],
    state: Path,
    *,
    send_report: bool,
    send_notices: bool,
    dry: bool,
    wait_seconds: float,
    say: Callable[[str], None],
    tz: str | None = None,
) -> None:
    """One ``aiscope notify``: choose, plan, then send (or print, with ``dry``); ``tz`` is the
    zone the mailed report shows times in."""
    from analyzer.notices import choose, told  # noqa: PLC0415

    notices = choose(doc, users, cfg.rules) if send_notices else []
    sent = sent_before(state, wait_seconds) if notices else []
    fresh = [n for n in notices if not told(n, sent)]
    again = [n for n in notices if told(n, sent)]
    report = _report_forms(doc, tz) if send_report else None
    box = plan(cfg, doc, fresh, report)
    if again:
        say(f"{len(again)} finding(s) told before: not sent again")
    if dry:
        dry_run(box, say)
        return
    if box.notices or again:
        check_state(state, wait_seconds)  # before anything goes out, not after
    # A finding that goes on is still the one told: its newer span is kept, so a later window
    # that no longer reaches the first span still recognizes it.
    record_sent(state, [_sent(n, "", "seen", time.time()) for n in again], wait_seconds)
    deliver(cfg, box, lambda rows: record_sent(state, rows, wait_seconds), say)
    if not box.report_mail and not box.posts and not box.notices:
        say("nothing to send")


def _report_forms(doc: dict[str, Any], tz: str | None = None) -> ReportForms:
    """The report's text form (plain, 100 columns), its HTML page (times in ``tz``), and the
    CSV tables both refer to (:data:`MAIL_ATTACHMENTS`, in UTC as the JSON)."""
    import io  # noqa: PLC0415

    from report.content import in_zone  # noqa: PLC0415
    from report.export import render as render_csv  # noqa: PLC0415
    from report.html import render as render_html  # noqa: PLC0415
    from report.text import render as render_text  # noqa: PLC0415

    buffer = io.StringIO()
    human = in_zone(doc, tz)
    render_text(human, file=buffer, width=100, attached=MAIL_ATTACHMENTS)
    gpus, findings = render_csv(doc)
    files = ((MAIL_ATTACHMENTS["gpus"], gpus), (MAIL_ATTACHMENTS["findings"], findings))
    return buffer.getvalue(), render_html(human, attached=MAIL_ATTACHMENTS), files
