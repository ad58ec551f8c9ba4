"""Remove secrets from command lines and environment entries before anything is stored.

Rules (each one seen leaking in real process listings):

* ``--token X`` / ``--token=X`` and friends: the value after a flag whose name says secret.
* ``NAME=VALUE`` where NAME says secret (``*_KEY``, ``*_SECRET``, ``*_TOKEN``, ``PASSWORD``, ...).
* URLs with credentials (``https://user:pass@host``) and secret-looking query parameters
  (``?token=...``).

A false positive costs a redacted value in a report; a false negative leaks a credential into a
database that is copied around a fleet. The patterns therefore err on the side of redacting.
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"

_SECRET_WORD = (
    r"(?:pass(?:word|wd|phrase)?|secret|token|api[-_]?key|apikey|access[-_]?key|private[-_]?key"
    r"|secret[-_]?key|credentials?|auth(?:orization)?|session[-_]?key|client[-_]?secret|key)"
)
# A flag like --token, --hf-token, --db-password, --api-key, -password, --NotebookApp.token.
_SECRET_FLAG = re.compile(rf"^--?(?:[\w.-]*[-_.])?{_SECRET_WORD}$", re.IGNORECASE)
# NAME=VALUE where NAME is a secret-looking identifier (env style or flag style).
_SECRET_ASSIGNMENT = re.compile(
    rf"^(?P<name>--?(?:[\w.-]*[-_.])?{_SECRET_WORD}|(?:[A-Za-z0-9]+[_.-])*{_SECRET_WORD})=(?P<value>.*)$",
    re.IGNORECASE,
)
_URL_CREDENTIALS = re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]*)@"
)
_QUERY_SECRET = re.compile(
    rf"(?P<key>[?&;](?:[\w-]*[-_])?{_SECRET_WORD}=)(?P<value>[^&#\s]*)", re.I
)


def redact_text(text: str) -> str:
    """Redact credentials embedded in URLs inside one string."""
    text = _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)
    return _QUERY_SECRET.sub(lambda m: f"{m['key']}{REDACTED}", text)


def redact_argv(argv: list[str]) -> list[str]:
    """Redact an argument vector: secret flag values, secret assignments and URL credentials."""
    out: list[str] = []
    redact_next = False
    for arg in argv:
        if redact_next:
            out.append(REDACTED)
            redact_next = False
            continue
        assignment = _SECRET_ASSIGNMENT.match(arg)
        if assignment:
            out.append(f"{assignment['name']}={REDACTED}")
        elif _SECRET_FLAG.match(arg):
            out.append(arg)
            redact_next = True
        else:
            out.append(redact_text(arg))
    return out


def redact_environment_entry(name: str, value: str) -> str:
    """The value to store for an environment entry: redacted when the name says secret."""
    if _SECRET_ASSIGNMENT.match(f"{name}=x"):
        return REDACTED
    return redact_text(value)
