"""Job summaries kept with the Slurm job: the epilog's ``AdminComment``, read back on a login node.

The epilog (``deploy/slurm/aiscope-epilog.sh``) stores ``aiscope:`` + base64(gzip(JSON)) of
``aiscope job ID --format json`` in the job's ``AdminComment``, as Princeton's jobstats stores its
``JS1:`` summaries there, so the summary outlives the node stores' retention and needs none of
them. This module is the only caller of ``scontrol`` and ``sacct``: ``scontrol show job`` while
slurmctld still knows the job (``MinJobAge``, 300 s by default), ``sacct`` from the accounting
database after that.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from store.errors import BadInput, Failure

PREFIX = "aiscope:"
#: Seconds a Slurm client may take before we give up on it.
CLIENT_TIMEOUT_SECONDS = 30.0
_SLURM_ID = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?$")
_ADMIN_COMMENT = re.compile(r"(?:^|\s)AdminComment=(\S+)")

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


class SlurmUnavailable(Failure):
    """Neither ``scontrol`` nor ``sacct`` is on PATH (not a Slurm login node)."""


def looks_like_slurm_id(job_id: str) -> bool:
    """``12345``, an array task ``12345_7`` or a heterogeneous component ``12345+1``."""
    return bool(_SLURM_ID.match(job_id.strip()))


def encode(doc: dict[str, Any]) -> str:
    """The ``AdminComment`` value for ``doc`` (what the epilog's gzip | base64 pipe writes)."""
    raw = json.dumps(doc, separators=(",", ":")).encode()
    return PREFIX + base64.b64encode(gzip.compress(raw, 9)).decode("ascii")


def decode(comment: str, job_id: str) -> dict[str, Any]:
    """The summary in an ``AdminComment``; :class:`BadInput` when it holds none or is damaged."""
    token = next((t for t in comment.split() if t.startswith(PREFIX)), None)
    if token is None:
        raise BadInput(
            f"job {job_id}: its AdminComment holds no aiscope summary (the epilog did not run "
            "for it or failed: see the epilog's log, `journalctl -t aiscope-epilog`)"
        )
    try:
        doc = json.loads(gzip.decompress(base64.b64decode(token[len(PREFIX) :], validate=True)))
    except (binascii.Error, OSError, EOFError, ValueError) as exc:
        raise BadInput(f"job {job_id}: its AdminComment summary is damaged ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != "aiscope.job/1":
        raise BadInput(f"job {job_id}: its AdminComment summary is not an aiscope.job/1 document")
    return doc


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_SECONDS, check=False
    )


def admin_comment(
    job_id: str, run: Runner = _run, which: Callable[[str], str | None] = shutil.which
) -> str | None:
    """The job's ``AdminComment``: from slurmctld while it knows the job, else from sacct.
    ``None`` when neither has one. :class:`SlurmUnavailable` without both clients."""
    scontrol, sacct = which("scontrol"), which("sacct")
    if scontrol is None and sacct is None:
        raise SlurmUnavailable(
            f"job {job_id}: not in the stores, and scontrol/sacct are not on PATH to read the "
            "summary the epilog stored (run on a Slurm login node, or give --store)"
        )
    try:
        if scontrol is not None:
            shown = run([scontrol, "show", "job", "--oneliner", job_id])
            match = _ADMIN_COMMENT.search(shown.stdout) if shown.returncode == 0 else None
            if match:
                return match.group(1)
        if sacct is not None:
            done = run(
                [
                    sacct,
                    "--noheader",
                    "--parsable2",
                    "--allocations",
                    "--jobs",
                    job_id,
                    "--format",
                    "AdminComment",
                ]
            )
            lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
            if done.returncode == 0 and lines:
                return lines[0]
    except subprocess.TimeoutExpired as exc:
        raise Failure(f"job {job_id}: {exc.cmd[0]} did not answer in {exc.timeout:g} s") from None
    return None


def read_summary(
    job_id: str, run: Runner = _run, which: Callable[[str], str | None] = shutil.which
) -> dict[str, Any]:
    """The ``aiscope.job/1`` document the epilog stored with ``job_id``."""
    if not looks_like_slurm_id(job_id):
        raise BadInput(f"--slurm: {job_id!r} is not a Slurm job id (like 12345 or 12345_7)")
    comment = admin_comment(job_id, run, which)
    if comment is None:
        raise BadInput(
            f"job {job_id}: Slurm knows no such job, or it has no AdminComment (the epilog "
            "stores one when the job ends)"
        )
    doc = decode(comment, job_id)
    doc["source"] = {"slurm": "AdminComment"}
    return doc
