"""The one way a URL is shown: in errors, log lines, progress lines and documents.

URLs carry secrets in three places (issue #27): the userinfo (``https://user:pass@host``), query
values (``?apikey=…``, ``&sig=…``) and, for chat webhooks, the last path segment
(``https://hooks.slack.com/services/T…/B…/<token>``, Discord's ``/api/webhooks/<id>/<token>``).
:func:`mask_url` keeps what locates the server (scheme, host, port, path, query parameter names)
and replaces each of those with :data:`MASK`. Whatever shows a URL to a person or writes it into a
file goes through it; only the request itself uses the URL as given. Importing nothing of ours,
it is part of the store contract every room may use.
"""

from __future__ import annotations

import re
import urllib.parse

MASK = "***"
_USERINFO = re.compile(r"(//)[^/?#@]*@")


def mask_url(url: str, webhook: bool = False) -> str:
    """``url`` for display: userinfo, query and fragment values masked, and with ``webhook``
    the last path segment too. A string that does not parse as a URL keeps its scheme and host
    only as far as they can be told apart, and loses everything after a ``?``."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
    except ValueError:
        head, mark, _ = _USERINFO.sub(rf"\1{MASK}@", url).partition("?")
        return head + (f"?{MASK}" if mark else "")
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rsplit('@', 1)[1]}"
    path = parts.path
    if webhook and path.strip("/"):
        path = f"{path.rstrip('/').rpartition('/')[0]}/{MASK}"
    return urllib.parse.urlunsplit(
        (parts.scheme, netloc, path, _mask_pairs(parts.query), _mask_pairs(parts.fragment))
    )


def _mask_pairs(text: str) -> str:
    """``a=1&b=2`` becomes ``a=***&b=***``; a piece without ``=`` is a value of its own."""
    if not text:
        return text
    pieces = (piece.partition("=") for piece in text.split("&"))
    return "&".join(f"{name}={MASK}" if eq else (MASK if name else "") for name, eq, _ in pieces)
