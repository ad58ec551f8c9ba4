"""The supply chain's pinned files: the image's lock, CI's lock and the image's SBOM.

    python deploy/lock.py           # re-resolve (needs PyPI) and rewrite all three
    python deploy/lock.py --check   # offline: are they consistent with pyproject and each other?

* ``deploy/requirements.lock``: what the container image installs (``deploy/Dockerfile``,
  ``pip install --require-hashes``): the runtime dependencies, exact versions with their
  sha256 hashes, resolved for the image's Python (3.12) on x86_64 manylinux, with the build
  backend (``deploy/build-requirements.in``: setuptools) so the build downloads nothing unpinned.
* ``deploy/requirements-dev.lock``: what CI installs before the project (``.ci/run``): the same
  plus the ``dev`` extra, resolved for every platform and Python 3.11+ (``--universal``).
* ``deploy/sbom.cdx.json``: the image's CycloneDX SBOM, generated from the image's lock by
  ``cyclonedx-py requirements`` with reproducible output (no serial number, no timestamp), so
  the check can regenerate it and compare bytes.

``pyproject.toml`` keeps loose ranges for people who ``pip install aiscope`` into their own
environment; the locks are for what we ship and what we test with. ``--check`` fails (exit 1,
one line per problem) when a lock misses a dependency of pyproject or pins it outside its
range, when a pin has no hash, or when the SBOM is not the one the lock gives.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

DEPLOY = Path(__file__).resolve().parent
REPO = DEPLOY.parent
BIN = Path(sys.executable).parent
IMAGE_LOCK = DEPLOY / "requirements.lock"
DEV_LOCK = DEPLOY / "requirements-dev.lock"
SBOM = DEPLOY / "sbom.cdx.json"
BUILD_IN = DEPLOY / "build-requirements.in"
IMAGE_PYTHON = "3.12"
COMPILE = [
    str(BIN / "uv"),
    "pip",
    "compile",
    "pyproject.toml",
    "--generate-hashes",
    "--custom-compile-command",
    "python deploy/lock.py",
    "--quiet",
]
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def pins(lock: Path) -> dict[str, tuple[str, int]]:
    """``name -> (version, number of hashes)`` of a ``pip-compile``-style lock (a name locked
    twice under different markers keeps its last version)."""
    out: dict[str, tuple[str, int]] = {}
    name = ""
    for line in lock.read_text().splitlines():
        found = _PIN.match(line)
        if found:
            name = canonicalize_name(found.group(1))
            out[name] = (found.group(2), 0)
        elif name and line.strip().startswith("--hash=sha256:"):
            version, hashes = out[name]
            out[name] = (version, hashes + 1)
    return out


def check_lock(lock: Path, extras: tuple[str, ...]) -> list[str]:
    """Every dependency of pyproject (and of ``extras``) is pinned, in range, with hashes."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in extras:
        wanted += project["optional-dependencies"][extra]
    locked = pins(lock)
    problems = []
    for text in wanted:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        if name not in locked:
            problems.append(f"{lock.name}: {req.name} is not locked")
        elif not req.specifier.contains(locked[name][0], prereleases=True):
            problems.append(f"{lock.name}: {req.name}=={locked[name][0]} is outside {text!r}")
    problems += [f"{lock.name}: {n} has no hash" for n, (_, h) in locked.items() if not h]
    return problems


def sbom_text(lock: Path) -> str:
    """The CycloneDX JSON of ``lock``, reproducible (same lock, same bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sbom.json"
        subprocess.run(
            [
                str(BIN / "cyclonedx-py"),
                "requirements",
                str(lock.relative_to(REPO)),
                "--pyproject",
                "pyproject.toml",
                "--of",
                "JSON",
                "--output-reproducible",
                "-o",
                str(out),
            ],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        return out.read_text()


def check_sbom() -> list[str]:
    if not SBOM.exists():
        return [f"{SBOM.name}: missing (run python deploy/lock.py)"]
    problems = []
    listed = {
        (canonicalize_name(c["name"]), c["version"])
        for c in json.loads(SBOM.read_text())["components"]
    }
    locked = {(n, v) for n, (v, _) in pins(IMAGE_LOCK).items()}
    if listed != locked:
        problems.append(f"{SBOM.name}: components differ from {IMAGE_LOCK.name}: {listed ^ locked}")
    if sbom_text(IMAGE_LOCK) != SBOM.read_text():
        problems.append(
            f"{SBOM.name}: not what {IMAGE_LOCK.name} gives (run python deploy/lock.py)"
        )
    return problems


def write() -> None:
    image = ["--python-version", IMAGE_PYTHON, "--python-platform", "x86_64-manylinux_2_28"]
    backend = str(BUILD_IN.relative_to(REPO))  # setuptools, to build the project offline
    subprocess.run([*COMPILE, backend, *image, "-o", str(IMAGE_LOCK)], cwd=REPO, check=True)
    dev = ["--extra", "dev", "--universal", "--python-version", "3.11"]
    subprocess.run([*COMPILE, *dev, "-o", str(DEV_LOCK)], cwd=REPO, check=True)
    SBOM.write_text(sbom_text(IMAGE_LOCK))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="check, offline; write nothing")
    args = parser.parse_args()
    if not args.check:
        write()
    problems = check_lock(IMAGE_LOCK, ()) + check_lock(DEV_LOCK, ("dev",)) + check_sbom()
    for problem in problems:
        print(f"lock: {problem}")
    if not problems:
        print(f"lock: {IMAGE_LOCK.name}, {DEV_LOCK.name} and {SBOM.name} agree with pyproject.toml")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
