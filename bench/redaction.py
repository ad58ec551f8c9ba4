"""How well redaction separates credentials from the rest of a GPU command line.

Usage: python bench/redaction.py [--samples 2000] [--seed 1]

* False positives: the share of lines and arguments changed in the two corpora of realistic
  command lines (fixtures/cmdlines: ``benign-tuning`` the rules were tuned on, ``benign-heldout``
  written afterwards).
* Detection by shape alone (no name gives a hint: ``python serve.py --db SECRET``), per kind of
  generated secret. Named positions (``--token X``, ``PGPASSWORD=X``, ...) are always redacted;
  tests/test_redact.py proves that with Hypothesis, so they are not sampled here.
* Cost: microseconds per command line (cold, and the store's cached second pass).
"""

from __future__ import annotations

import argparse
import base64
import random
import secrets
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agent.redact import redact_argv, redact_cmdline

CORPORA = Path(__file__).resolve().parent.parent / "fixtures" / "cmdlines"


def corpus(name: str) -> list[str]:
    lines = (CORPORA / f"{name}.txt").read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def false_positives(name: str) -> None:
    lines = corpus(name)
    changed_lines = changed_args = args = 0
    for line in lines:
        argv = line.split(" ")
        out = redact_argv(argv)
        args += len(argv)
        changed_args += sum(a != b for a, b in zip(argv, out, strict=True))
        changed_lines += redact_cmdline(line) != line or out != argv
    print(
        f"{name:16} {changed_lines}/{len(lines)} lines changed, "
        f"{changed_args}/{args} arguments ({changed_args / args:.2%})"
    )


def generators(rng: random.Random) -> dict[str, Callable[[], str]]:
    def chars(alphabet: str, n: int) -> Callable[[], str]:
        return lambda: "".join(rng.choice(alphabet) for _ in range(n))

    return {
        "token_urlsafe(32), 43 chars": lambda: secrets.token_urlsafe(32),
        "token_urlsafe(16), 22 chars": lambda: secrets.token_urlsafe(16),
        "base64 of 30 bytes (AWS-like)": lambda: base64.b64encode(secrets.token_bytes(30)).decode(),
        "base62, 20 chars": chars(string.ascii_letters + string.digits, 20),
        "base62, 32 chars": chars(string.ascii_letters + string.digits, 32),
        "base36, 24 chars": chars(string.ascii_lowercase + string.digits, 24),
        "hex, 48 chars (Jupyter)": lambda: secrets.token_hex(24),
        "hex, 32 chars (kept: MD5-like)": lambda: secrets.token_hex(16),
        "hex, 40 chars (kept: commit-like)": lambda: secrets.token_hex(20),
    }


def detection(samples: int, rng: random.Random) -> None:
    for name, make in generators(rng).items():
        caught = 0
        for _ in range(samples):
            secret = make()
            caught += secret not in redact_cmdline(f"python serve.py --db {secret} --port 80")
        print(f"  {name:34} {caught / samples:6.1%} dropped by shape")


def cost() -> None:
    lines = corpus("benign-tuning") + corpus("benign-heldout")
    started = time.perf_counter()
    for line in lines:
        redact_argv(line.split(" "))
    argv_us = (time.perf_counter() - started) / len(lines) * 1e6
    redact_cmdline.cache_clear()
    started = time.perf_counter()
    for line in lines:
        redact_cmdline(line)
    cold_us = (time.perf_counter() - started) / len(lines) * 1e6
    started = time.perf_counter()
    for line in lines:
        redact_cmdline(line)
    warm_us = (time.perf_counter() - started) / len(lines) * 1e6
    print(
        f"cost per line: argv pass {argv_us:.0f} us, store pass {cold_us:.0f} us "
        f"(cached: {warm_us:.2f} us)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print("false positives (realistic GPU command lines, no credential in them):")
    false_positives("benign-tuning")
    false_positives("benign-heldout")
    print(f"secrets with no name to give them away ({args.samples} each):")
    detection(args.samples, random.Random(args.seed))
    cost()
    return 0


if __name__ == "__main__":
    sys.exit(main())
