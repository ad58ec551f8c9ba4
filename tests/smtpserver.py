"""A real SMTP server process for tests: aiosmtpd on loopback with STARTTLS required, AUTH
(LOGIN/PLAIN) required and allowed only after TLS, every accepted message written to a directory.

Run as ``python tests/smtpserver.py --cert C --key K --user U --password-file F --out DIR``; it
prints ``PORT <n>`` once it accepts connections and serves until terminated.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import ssl
import sys
import threading
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword


class Saver:
    """Writes each message as ``N.eml`` with its envelope in ``N.json``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.count = 0

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.count += 1
        base = self.out / f"{self.count:04d}"
        base.with_suffix(".eml").write_bytes(envelope.original_content or envelope.content)
        meta = {
            "from": envelope.mail_from,
            "to": envelope.rcpt_tos,
            "tls": session.ssl is not None,
            "authenticated": bool(session.authenticated),
        }
        base.with_suffix(".json").write_text(json.dumps(meta))
        return "250 OK"


def main() -> None:
    p = argparse.ArgumentParser()
    for flag in ("--cert", "--key", "--user", "--password-file", "--out"):
        p.add_argument(flag, required=True)
    a = p.parse_args()
    user, password = a.user.encode(), Path(a.password_file).read_text().strip().encode()

    def authenticator(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> Any:
        ok = isinstance(data, LoginPassword) and data.login == user and data.password == password
        return AuthResult(success=ok, handled=False)

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(a.cert, a.key)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    controller = Controller(
        Saver(Path(a.out)),
        hostname="127.0.0.1",
        port=port,
        tls_context=context,
        require_starttls=True,
        authenticator=authenticator,
        auth_require_tls=True,
        auth_required=True,
    )
    controller.start()
    print(f"PORT {port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    controller.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
