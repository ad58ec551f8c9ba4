"""store.masking.mask_url: the one display form of a URL (issue #27: secrets never echo)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store.masking import MASK, mask_url

M = MASK


@pytest.mark.parametrize(
    ("url", "webhook", "shown"),
    [
        ("http://prom:9090", False, "http://prom:9090"),
        ("https://prom.example/api/prom", False, "https://prom.example/api/prom"),
        ("https://prom/?apikey=s3cr3t&org=7", False, f"https://prom/?apikey={M}&org={M}"),
        ("https://alice:s3cr3t@prom:9090/x", False, f"https://{M}@prom:9090/x"),
        ("https://s3cr3t@github.com/o/r", False, f"https://{M}@github.com/o/r"),
        ("https://h/p#access_token=s3cr3t", False, f"https://h/p#access_token={M}"),
        ("https://h/p?s3cr3t", False, f"https://h/p?{M}"),
        (
            "https://hooks.slack.com/services/T0/B0/s3cr3t",
            True,
            f"https://hooks.slack.com/services/T0/B0/{M}",
        ),
        (
            "https://u:s3cr3t@chat.example/hooks/s3cr3t/?token=s3cr3t",
            True,
            f"https://{M}@chat.example/hooks/{M}?token={M}",
        ),
        ("http://[::1/?apikey=s3cr3t", False, f"http://[::1/?{M}"),  # does not parse
    ],
)
def test_what_is_kept_and_what_is_masked(url: str, webhook: bool, shown: str) -> None:
    assert mask_url(url, webhook=webhook) == shown
    assert "s3cr3t" not in shown


# A digit in every secret: no part of the URLs' fixed text has one, so a hit is the secret.
_secret = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_.~", min_size=6, max_size=30).filter(
    lambda s: any(c.isdigit() for c in s)
)


@given(secret=_secret, where=st.sampled_from(["user", "password", "query", "fragment", "hook"]))
def test_a_secret_in_any_place_of_a_url_is_never_shown(secret: str, where: str) -> None:
    url = {
        "user": f"https://{secret}@h.example/api",
        "password": f"https://bob:{secret}@h.example/api",
        "query": f"https://h.example/api?x=1&key={secret}",
        "fragment": f"https://h.example/api#{secret}",
        "hook": f"https://h.example/hooks/{secret}",
    }[where]
    assert secret not in mask_url(url, webhook=True)
