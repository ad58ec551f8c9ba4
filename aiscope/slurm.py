"""Job summaries kept with the Slurm job: the epilog's ``AdminComment``, read back on a login node.

The epilog (``deploy/slurm/aiscope-epilog.sh``) stores ``aiscope32:`` + base32(gzip(JSON)) of
``aiscope job ID --format json`` in the job's ``AdminComment``, as Princeton's jobstats stores its
``JS1:`` summaries there, so the summary outlives the node stores' retention and needs none of
them. This module is the only caller of ``scontrol``, ``squeue`` and ``sacct``: slurmctld's record
while it still knows the job (``MinJobAge``, 300 s by default), the accounting database after that.

Every answer is read structurally (issue #27): the ``admin_comment`` field of the job's record in
``scontrol show job --json`` (Slurm 23.02+) or ``squeue --json`` (21.08+; Debian 12's 22.05 has
no ``scontrol --json``), or the second field of ``sacct -P -n -o JobID,AdminComment``. Never a
search of ``scontrol show job --oneliner``'s line, where the job's name, which its owner sets,
comes first: a job named ``x AdminComment=aiscope:<forged>`` won that search. A summary that
names another job than the one asked is refused. Without slurmdbd (``sacct`` then answers that
accounting is disabled) the summary is readable only while slurmctld keeps the job.
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
from dataclasses import dataclass
from typing import Any

from store.errors import BadInput, Failure

#: ``aiscope32:`` + base32(gzip(JSON)): what the epilog stores. Base32 because sacctmgr (Slurm
#: 22.05, the way a comment is stored once the job has ended) lowercases the value it sets, which
#: destroys base64 and not base32 (decoded case-insensitively).
PREFIX = "aiscope32:"
#: ``aiscope:`` + base64(gzip(JSON)): what earlier epilogs stored through scontrol; still read.
PREFIX_BASE64 = "aiscope:"
#: Seconds a Slurm client may take before we give up on it.
CLIENT_TIMEOUT_SECONDS = 30.0
_SLURM_ID = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?$")

Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


class SlurmUnavailable(Failure):
    """Neither ``scontrol`` nor ``sacct`` is on PATH (not a Slurm login node)."""


def looks_like_slurm_id(job_id: str) -> bool:
    """``12345``, an array task ``12345_7`` or a heterogeneous component ``12345+1``."""
    return bool(_SLURM_ID.match(job_id.strip()))


def encode(doc: dict[str, Any]) -> str:
    """The ``AdminComment`` value for ``doc`` (what the epilog's ``gzip -9 -n | base32`` pipe
    writes)."""
    raw = json.dumps(doc, separators=(",", ":")).encode()
    return PREFIX + base64.b32encode(gzip.compress(raw, 9, mtime=0)).decode("ascii")


def _payload(token: str) -> bytes:
    if token.lower().startswith(PREFIX):
        return base64.b32decode(token[len(PREFIX) :], casefold=True)
    return base64.b64decode(token[len(PREFIX_BASE64) :], validate=True)


def decode(comment: str, job_id: str) -> dict[str, Any]:
    """The summary in an ``AdminComment``; :class:`BadInput` when it holds none or is damaged."""
    prefixes = (PREFIX, PREFIX_BASE64)
    token = next((t for t in comment.split() if t.lower().startswith(prefixes)), None)
    if token is None:
        raise BadInput(
            f"job {job_id}: its AdminComment holds no aiscope summary (the epilog did not run "
            "for it or failed: see the epilog's log, `journalctl -t aiscope-epilog`)"
        )
    try:
        doc = json.loads(gzip.decompress(_payload(token)))
    except (binascii.Error, OSError, EOFError, ValueError) as exc:
        raise BadInput(f"job {job_id}: its AdminComment summary is damaged ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != "aiscope.job/1":
        raise BadInput(f"job {job_id}: its AdminComment summary is not an aiscope.job/1 document")
    return doc


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_SECONDS, check=False
    )


@dataclass(frozen=True, slots=True)
class Comment:
    """A job's ``AdminComment``, read as one field of the record Slurm keeps for ``ids`` (the
    job's own id and, for an array task or a heterogeneous component, its ``A_T`` / ``H+O``
    name), and the client that read it."""

    text: str
    ids: frozenset[str]
    source: str


def _number(value: object) -> int | None:
    """A Slurm JSON number: a bare int (22.05's v0.0.38) or ``{"set": …, "number": …}`` (23.02+)."""
    if isinstance(value, dict):
        return _number(value.get("number")) if value.get("set", True) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _record_ids(record: dict[str, Any]) -> frozenset[str]:
    ids = {str(n) for n in (_number(record.get("job_id")),) if n is not None}
    array, task = _number(record.get("array_job_id")), _number(record.get("array_task_id"))
    if array and task is not None:
        ids.add(f"{array}_{task}")
    het, offset = _number(record.get("het_job_id")), _number(record.get("het_job_offset"))
    if het and offset is not None:
        ids.add(f"{het}+{offset}")
    return frozenset(ids)


def _from_json(text: str, job_id: str, source: str) -> Comment | None:
    """The ``admin_comment`` field of ``job_id``'s record in a ``--json`` answer: one field of
    a structured record, so nothing the job's owner sets (its name, its comment) can stand in
    for it. ``None`` when the answer is not JSON (an older client) or has no such record."""
    try:
        jobs = json.loads(text).get("jobs")
    except (ValueError, AttributeError):
        return None
    for record in jobs if isinstance(jobs, list) else []:
        ids = _record_ids(record) if isinstance(record, dict) else frozenset()
        if job_id in ids:
            value = record.get("admin_comment")
            return Comment(value, ids, source) if isinstance(value, str) and value else None
    return None


def _from_sacct(text: str, job_id: str) -> Comment | None:
    """``sacct -P -n -o JobID,AdminComment``: a job id has no ``|``, so the first ``|`` of a
    line ends it and the rest of the line is the comment, whole."""
    for line in text.splitlines():
        asked, sep, value = line.partition("|")
        if sep and asked == job_id and value.strip():
            return Comment(value.strip(), frozenset({job_id}), "sacct")
    return None


def _queries(job_id: str, which: Callable[[str], str | None]) -> list[tuple[list[str], str]]:
    """The clients to ask, in order: slurmctld's record while it keeps the job (``scontrol
    show job --json``, Slurm 23.02+; ``squeue --json``, 21.08+), then the accounting database."""
    scontrol, squeue, sacct = which("scontrol"), which("squeue"), which("sacct")
    asks: list[tuple[list[str], str]] = []
    if scontrol is not None:
        asks.append(([scontrol, "show", "job", "--json", job_id], "scontrol"))
    if squeue is not None:
        asks.append(([squeue, "--json", "--states=all", "--jobs", job_id], "squeue"))
    if sacct is not None:
        fields = ["--format", "JobID,AdminComment"]
        asks.append(([sacct, "-P", "-n", "--allocations", "--jobs", job_id, *fields], "sacct"))
    return asks


def admin_comment(
    job_id: str, run: Runner = _run, which: Callable[[str], str | None] = shutil.which
) -> Comment | None:
    """The job's ``AdminComment``: from slurmctld while it knows the job, else from sacct.
    ``None`` when none has one. :class:`SlurmUnavailable` without any Slurm client."""
    asks = _queries(job_id, which)
    if not asks:
        raise SlurmUnavailable(
            f"job {job_id}: not in the stores, and scontrol/squeue/sacct are not on PATH to read "
            "the summary the epilog stored (run on a Slurm login node, or give --store)"
        )
    try:
        for argv, source in asks:
            done = run(argv)
            if done.returncode != 0:
                continue  # an older client without --json, or a job this source does not keep
            found = (
                _from_sacct(done.stdout, job_id)
                if source == "sacct"
                else _from_json(done.stdout, job_id, source)
            )
            if found is not None:
                return found
    except subprocess.TimeoutExpired as exc:
        raise Failure(f"job {job_id}: {exc.cmd[0]} did not answer in {exc.timeout:g} s") from None
    return None


def check_job(doc: dict[str, Any], comment: Comment, job_id: str) -> None:
    """A summary must name the job whose record holds it (``job.id``: the asked id, or the
    job's own id for an array task's epilog): a comment copied from another job is refused."""
    named = (doc.get("job") or {}).get("id") if isinstance(doc.get("job"), dict) else None
    if str(named) not in comment.ids | {job_id}:
        raise BadInput(
            f"job {job_id}: its AdminComment holds the summary of job {named!r}, not this one"
        )


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
    doc = decode(comment.text, job_id)
    check_job(doc, comment, job_id)
    doc["source"] = {"slurm": "AdminComment", "read_with": comment.source}
    return doc
