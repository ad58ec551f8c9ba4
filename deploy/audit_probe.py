"""Exit 0 when pip-audit's advisory source answers, 1 when it cannot be reached (.ci/run).

pip-audit's default source is PyPI's JSON API, one request per pinned version
(``https://pypi.org/pypi/NAME/VERSION/json``, whose ``vulnerabilities`` list is the advisory
data). A mirror that serves packages but not this API, or no network, makes pip-audit report
every dependency as "not found on PyPI" instead of auditing it; this probe tells the two apart
in one request with a short timeout, so CI can skip the audit with one clear line.
"""

from __future__ import annotations

import json
import sys
import urllib.request

PROBE = "https://pypi.org/pypi/pip/24.0/json"


def reachable(url: str = PROBE, timeout_seconds: float = 8.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_seconds) as response:
            body = json.loads(response.read())
    except (OSError, ValueError):
        return False
    return isinstance(body, dict) and isinstance(body.get("vulnerabilities"), list)


if __name__ == "__main__":
    sys.exit(0 if reachable() else 1)
