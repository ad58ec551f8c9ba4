"""The supply chain's pinned files: the image's lock, CI's lock and the image's SBOM.

    python deploy/lock.py           # re-resolve (needs PyPI) and rewrite all four
    python deploy/lock.py --check   # are they consistent with pyproject and each other?

* ``deploy/requirements.lock``: what the container image installs (``deploy/Dockerfile``,
  ``pip install --require-hashes``): the runtime dependencies, exact versions with their
  sha256 hashes, resolved for the image's Python (3.12) on x86_64 manylinux, with the build
  backend (``deploy/build-requirements.in``: setuptools) so the build downloads nothing unpinned.
* ``deploy/requirements-dev.lock``: what CI installs before the project (``.ci/run``): the same
  plus the ``dev`` extra, resolved for every platform and Python 3.11+ (``--universal``).
* ``deploy/sbom.cdx.json``: the image's CycloneDX SBOM, generated from the image's lock by
  ``cyclonedx-py requirements`` with reproducible output (no serial number, no timestamp), so
  the check can regenerate it and compare bytes.
* ``deploy/requirements-sbom.lock``: ``cyclonedx-py``'s own environment (``deploy/sbom-tool.in``,
  exact versions with hashes), which this script creates in ``.venv-sbom`` (``--sbom-venv``) the
  first time it needs it, and again when the lock changes. It is kept out of the dev extra:
  its schema validation pulls ``jsonschema[format-nongpl]``, and every Ray daemon started from
  the dev environment then imports ``rfc3987-syntax`` (about 2.3 CPU-seconds each), enough on a
  loaded 2-core runner for the tests' Ray head to miss its raylet's fixed 15 s wait.

``pyproject.toml`` keeps loose ranges for people who ``pip install aiscope`` into their own
environment; the locks are for what we ship and what we test with. ``--check`` fails (exit 1,
one line per problem) when a lock misses a dependency of pyproject or pins it outside its
range, when a pin has no hash, or when the SBOM is not the one the lock gives. It reads no
network once ``.venv-sbom`` exists (creating it downloads the tool's pinned wheels).
"""

from __future__ import annotations

import argparse
import hashlib
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
SBOM_TOOL_IN = DEPLOY / "sbom-tool.in"
SBOM_TOOL_LOCK = DEPLOY / "requirements-sbom.lock"
SBOM_VENV = REPO / ".venv-sbom"
#: In the SBOM tool's environment: the sha256 of the lock it was installed from.
_STAMP = "aiscope-lock.sha256"
IMAGE_PYTHON = "3.12"
COMPILE = [
    str(BIN / "uv"),
    "pip",
    "compile",
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
    return check_pins(lock, wanted)


def requirements_in(path: Path) -> list[str]:
    """The requirements of a ``.in`` file (one a line; ``#`` starts a comment)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def check_pins(lock: Path, wanted: list[str]) -> list[str]:
    """Every requirement in ``wanted`` is pinned in ``lock``, in range, and every pin has a
    hash."""
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


def sbom_tool(venv: Path) -> Path:
    """``cyclonedx-py`` in its own environment ``venv``, (re)created from
    :data:`SBOM_TOOL_LOCK` with ``--require-hashes`` when absent or installed from another
    lock."""
    digest = hashlib.sha256(SBOM_TOOL_LOCK.read_bytes()).hexdigest()
    stamp = venv / _STAMP
    tool = venv / "bin" / "cyclonedx-py"
    if tool.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return tool
    install = ["-m", "pip", "install", "-q", "--disable-pip-version-check", "--require-hashes"]
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "python"), *install, "-r", str(SBOM_TOOL_LOCK)], check=True
        )
    except subprocess.CalledProcessError as exc:  # no network, or a wheel whose hash is not locked
        raise SystemExit(
            f"lock: --sbom-venv {venv}: cannot install {SBOM_TOOL_LOCK.name} there "
            f"(exit {exc.returncode}; creating it downloads the tool's pinned wheels)"
        ) from exc
    stamp.write_text(digest + "\n")
    return tool


def sbom_text(lock: Path, venv: Path = SBOM_VENV) -> str:
    """The CycloneDX JSON of ``lock``, reproducible (same lock, same bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sbom.json"
        subprocess.run(
            [
                str(sbom_tool(venv)),
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


def check_sbom(venv: Path = SBOM_VENV) -> list[str]:
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
    if sbom_text(IMAGE_LOCK, venv) != SBOM.read_text():
        problems.append(
            f"{SBOM.name}: not what {IMAGE_LOCK.name} gives (run python deploy/lock.py)"
        )
    return problems


def write(venv: Path) -> None:
    image = ["--python-version", IMAGE_PYTHON, "--python-platform", "x86_64-manylinux_2_28"]
    backend = str(BUILD_IN.relative_to(REPO))  # setuptools, to build the project offline
    pyproject = "pyproject.toml"
    compile_image = [*COMPILE, pyproject, backend, *image, "-o", str(IMAGE_LOCK)]
    subprocess.run(compile_image, cwd=REPO, check=True)
    universal = ["--universal", "--python-version", "3.11"]
    dev = [pyproject, "--extra", "dev", *universal]
    subprocess.run([*COMPILE, *dev, "-o", str(DEV_LOCK)], cwd=REPO, check=True)
    tool = [str(SBOM_TOOL_IN.relative_to(REPO)), *universal, "-o", str(SBOM_TOOL_LOCK)]
    subprocess.run([*COMPILE, *tool], cwd=REPO, check=True)
    SBOM.write_text(sbom_text(IMAGE_LOCK, venv))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="check; write nothing")
    parser.add_argument(
        "--sbom-venv",
        type=Path,
        default=SBOM_VENV,
        help="cyclonedx-py's own environment, created from requirements-sbom.lock when absent "
        "(default: .venv-sbom in the repository; e.g. --sbom-venv /tmp/sbom-venv)",
    )
    args = parser.parse_args()
    if not args.check:
        write(args.sbom_venv)
    problems = check_lock(IMAGE_LOCK, ()) + check_lock(DEV_LOCK, ("dev",))
    problems += check_pins(SBOM_TOOL_LOCK, requirements_in(SBOM_TOOL_IN))
    problems += check_sbom(args.sbom_venv)
    for problem in problems:
        print(f"lock: {problem}")
    if not problems:
        names = f"{IMAGE_LOCK.name}, {DEV_LOCK.name}, {SBOM_TOOL_LOCK.name} and {SBOM.name}"
        print(f"lock: {names} agree with pyproject.toml")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
