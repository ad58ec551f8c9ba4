"""Declared intent: what a workload says it is, as evidence of its own kind beside behaviour.

The vocabulary the agent collects with, the readers of other people's telemetry translate into,
and the analyzer weighs (issue 23, section 1): which Kubernetes owner kinds, Slurm modes and
process signatures imply which class, which labels and annotations may be kept, and the owner-
chain rules that name a Deployment or CronJob from the ReplicaSet or Job a pod points at.

A declaration belongs to a *subject*, the same workload identity the analysis names tenants by
(most specific first, as ``analyzer.load.TENANT_SQL``): ``slurm:<job id>``, ``pod:<uid>``,
``unit:<systemd unit>``, else ``process:<pid>:<start ticks>``.

What each kind implies, and why:

* ``InferenceService`` (KServe), ``RayService``, ``LeaderWorkerSet`` (multi-host serving) and a
  ``Deployment`` (pods restarted forever: nothing finishes, so a service) imply ``inference``.
* ``PyTorchJob``, ``MPIJob``, ``TFJob`` (Kubeflow training operator) imply ``training``.
* ``Notebook`` (Kubeflow) implies ``interactive``; so does a Slurm allocation taken with
  ``salloc`` or ``srun --pty``.
* ``CronJob`` implies ``batch`` (a bounded run that recurs).
* ``Job``, ``StatefulSet``, ``DaemonSet``, ``RayCluster``, ``RayJob``, a bare ``Pod`` and a
  Slurm batch job imply nothing: each is used for training, batch and serving alike. They are
  still recorded and shown (kind and name), with ``implies`` null.
* Process signatures on the redacted command line: servers (vllm, sglang, tritonserver,
  text-generation-launcher, torchserve, ray serve) imply ``inference``; ``vllm bench`` (offline
  generation) implies ``batch``; notebooks (jupyter, ipykernel, code-server) ``interactive``;
  launchers (torchrun, deepspeed, accelerate launch, megatron) ``training``.

When a subject has several declarations, the one that decides is the most specific (a
purpose-built resource or its label over a command-line signature over a generic controller or
a Slurm mode): :func:`strength`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from store.schema import GpuClass, Process

# -- sources ---------------------------------------------------------------------------------------

KUBERNETES = "kubernetes"
KUBE_STATE_METRICS = "kube-state-metrics"
SLURM = "slurm"
SYSTEMD = "systemd"
CMDLINE = "cmdline"
SOURCES = (KUBERNETES, KUBE_STATE_METRICS, SLURM, SYSTEMD, CMDLINE)

_I, _T, _B, _N = GpuClass.INFERENCE, GpuClass.TRAINING, GpuClass.BATCH, GpuClass.INTERACTIVE

#: Kubernetes owner kinds (the top of a pod's owner chain) and the class each implies.
OWNER_KINDS: dict[str, GpuClass | None] = {
    "Deployment": _I,
    "ReplicaSet": _I,  # a ReplicaSet whose Deployment could not be named is still a service
    "StatefulSet": None,
    "DaemonSet": None,
    "Job": None,
    "CronJob": _B,
    "LeaderWorkerSet": _I,
    "PyTorchJob": _T,
    "MPIJob": _T,
    "TFJob": _T,
    "RayCluster": None,
    "RayJob": None,
    "RayService": _I,
    "Notebook": _N,
    "InferenceService": _I,
    "Pod": None,  # a bare pod: no controller
}
#: Kinds built for one purpose: they outrank a signature or a generic controller.
_PURPOSE_BUILT = frozenset(
    {
        "InferenceService",
        "Notebook",
        "PyTorchJob",
        "MPIJob",
        "TFJob",
        "RayService",
        "LeaderWorkerSet",
    }
)

SLURM_BATCH = "slurm batch"
SLURM_INTERACTIVE = "slurm interactive"
SLURM_JOB = "slurm job"  # a job whose mode could not be read
SLURM_KINDS: dict[str, GpuClass | None] = {
    SLURM_BATCH: None,
    SLURM_INTERACTIVE: _N,
    SLURM_JOB: None,
}
SYSTEMD_UNIT = "systemd unit"

#: Process signatures: (kind, class implied, pattern on the lower-cased redacted command line).
#: The first that matches names the process; ``vllm bench`` comes before ``vllm``.
SIGNATURES: tuple[tuple[str, GpuClass, re.Pattern[str]], ...] = tuple(
    (kind, cls, re.compile(pattern))
    for kind, cls, pattern in (
        ("vllm bench", _B, r"(^|[\s/])vllm\s+bench\b|benchmark_throughput\.py"),
        ("vllm", _I, r"(^|[\s/])vllm(\s|$)|\bvllm\.entrypoints\b"),
        ("sglang", _I, r"\bsglang\.launch_server\b|(^|[\s/])sglang(\s|$)"),
        ("tritonserver", _I, r"(^|[\s/])tritonserver(\s|$)"),
        ("text-generation-launcher", _I, r"(^|[\s/])text-generation-(launcher|server)(\s|$)"),
        ("torchserve", _I, r"(^|[\s/])torchserve(\s|$)|\bmodel_service_worker\.py\b"),
        ("ray serve", _I, r"(^|[\s/])serve\s+(run|deploy)\b|\bray\.serve\b"),
        ("jupyter", _N, r"(^|[\s/])jupyter(-lab|-notebook|-server)?(\s|$)|\bjupyterlab\b"),
        ("ipykernel", _N, r"\bipykernel(_launcher)?\b"),
        ("code-server", _N, r"(^|[\s/])code-server(\s|$)"),
        ("torchrun", _T, r"(^|[\s/])torchrun(\s|$)|\btorch\.distributed\.(run|launch)\b"),
        ("deepspeed", _T, r"(^|[\s/])deepspeed(\s|$)|\bdeepspeed\.launcher\b"),
        ("accelerate", _T, r"(^|[\s/])accelerate\s+launch\b|\baccelerate\.commands\.launch\b"),
        ("megatron", _T, r"\bmegatron\b|(^|[\s/])pretrain_(gpt|bert|t5|llama|mamba)\.py\b"),
    )
)

#: Label and annotation keys that may be stored: these prefixes, and these exact keys. Nothing
#: else of a pod's metadata is kept (labels carry team names, annotations carry configuration).
ALLOWED_PREFIXES = (
    "app.kubernetes.io/",
    "serving.kserve.io/",
    "ray.io/",
    "kueue.x-k8s.io/",
    "volcano.sh/",
    "leaderworkerset.sigs.k8s.io/",
)
ALLOWED_KEYS = frozenset({"notebook-name"})
#: Labels that name a purpose-built owner when the chain stops short of it (KServe's serverless
#: mode runs the predictor under a Knative revision; a Notebook's StatefulSet).
_LABEL_OWNERS = (
    ("serving.kserve.io/inferenceservice", "InferenceService"),
    ("notebook-name", "Notebook"),
    ("leaderworkerset.sigs.k8s.io/name", "LeaderWorkerSet"),
)

#: A CronJob names its Jobs ``<cronjob>-<scheduled minute since the epoch>`` (kube-controller-
#: manager's ``getJobName``: 8 or more digits since 1990).
_CRONJOB_JOB = re.compile(r"^(?P<cron>.+)-(?P<minute>\d{8,})$")
_REPLICASET = re.compile(r"^(?P<deployment>.+)-[bcdfghjklmnpqrstvwxz2456789]{6,10}$")


def allowed(key: str) -> bool:
    """Whether a label or annotation key may be stored."""
    return key in ALLOWED_KEYS or key.startswith(ALLOWED_PREFIXES)


def keep_allowed(mapping: object) -> dict[str, str]:
    """The allow-listed string entries of a label or annotation mapping (anything else: none)."""
    if not isinstance(mapping, dict):
        return {}
    return {
        k: v for k, v in mapping.items() if isinstance(k, str) and isinstance(v, str) and allowed(k)
    }


def deployment_of(replicaset: str, pod_template_hash: str | None) -> str | None:
    """The Deployment that owns ``replicaset``, by the name rule of the Deployment controller:
    ``<deployment>-<pod-template-hash>`` (the hash is the pod's own ``pod-template-hash``
    label). Without the label, a suffix of 6 to 10 characters of the alphabet the hash is
    written in (``rand.SafeEncodeString``: no vowels, no 0, 1, 3) stands for it. ``None`` when
    the name does not end in a hash (a ReplicaSet made by hand)."""
    if pod_template_hash:
        suffix = f"-{pod_template_hash}"
        if replicaset.endswith(suffix) and len(replicaset) > len(suffix):
            return replicaset[: -len(suffix)]
        return None
    match = _REPLICASET.match(replicaset)
    return match.group("deployment") if match else None


def cronjob_of(job: str) -> str | None:
    """The CronJob that made ``job``, by the CronJob controller's name rule; ``None`` when the
    name does not follow it."""
    match = _CRONJOB_JOB.match(job)
    return match.group("cron") if match else None


def signature(cmdline: str | None) -> tuple[str, GpuClass] | None:
    """The first process signature that matches the (redacted) command line: (kind, class)."""
    text = (cmdline or "").lower()
    for kind, cls, pattern in SIGNATURES:
        if pattern.search(text):
            return kind, cls
    return None


def implied(kind: str) -> GpuClass | None:
    """The class a declared kind implies, or ``None`` when it implies none."""
    if kind in OWNER_KINDS:
        return OWNER_KINDS[kind]
    if kind in SLURM_KINDS:
        return SLURM_KINDS[kind]
    return next((cls for k, cls, _ in SIGNATURES if k == kind), None)


def strength(kind: str, source: str) -> int:
    """How specific a declaration is: 3 a purpose-built resource, 2 a process signature, 1 a
    generic controller or a Slurm mode, 0 one that implies no class."""
    if implied(kind) is None:
        return 0
    if kind in _PURPOSE_BUILT:
        return 3
    return 2 if source == CMDLINE else 1


def label_owner(labels: dict[str, str]) -> tuple[str, str] | None:
    """(kind, name) of a purpose-built owner a pod's labels name, if any."""
    for key, kind in _LABEL_OWNERS:
        if labels.get(key):
            return kind, labels[key]
    return None


def subject_of(process: Process) -> str:
    """The workload identity a process's declarations belong to (most specific first)."""
    if process.slurm_job_id:
        return f"slurm:{process.slurm_job_id}"
    if process.k8s_pod_uid:
        return f"pod:{process.k8s_pod_uid}"
    if process.systemd_unit:
        return f"unit:{process.systemd_unit}"
    return f"process:{process.pid}:{process.start_ticks if process.start_ticks is not None else ''}"


#: :func:`subject_of` in SQL over a ``processes`` row aliased ``p``.
SUBJECT_SQL = (
    "coalesce('slurm:' || p.slurm_job_id, 'pod:' || p.k8s_pod_uid, 'unit:' || p.systemd_unit, "
    "'process:' || p.pid || ':' || coalesce(CAST(p.start_ticks AS VARCHAR), ''))"
)


def attributes_json(attributes: dict[str, Any]) -> str | None:
    """The declaration's extra facts (labels, priority class, partition, QOS, owner chain) as
    the JSON the store keeps; ``None`` when there are none."""
    kept = {k: v for k, v in attributes.items() if v not in (None, "", {}, [])}
    return json.dumps(kept, sort_keys=True, separators=(",", ":")) if kept else None


@dataclass(frozen=True, slots=True)
class Declared:
    """The declaration that speaks for a workload: its kind and name, the class it implies
    (``None``: none), and where it came from."""

    kind: str
    name: str | None
    implies: str | None
    source: str

    def describe(self) -> str:
        """``Deployment chat/x, declared inference`` (the words findings and reports use)."""
        what = f"{self.kind} {self.name}" if self.name else self.kind
        return f"{what}, declared {self.implies}" if self.implies else what
