"""Declared intent from kube-state-metrics, for ``--prometheus`` (``store.intent``).

The pods that held GPUs (the ``namespace``/``pod`` labels of dcgm-exporter's series, or aiscope's
``pod_uid`` ``<namespace>/<pod>``) are joined on namespace and pod to kube-state-metrics' series
over the window, when the server has them:

* ``kube_pod_owner`` (``owner_kind``, ``owner_name``, ``owner_is_controller``; ``<none>`` for
  a bare pod): the pod's controller;
* ``kube_replicaset_owner`` and ``kube_job_owner``: a ReplicaSet's Deployment and a Job's
  CronJob (else the controllers' name rules, ``store.intent``);
* ``kube_pod_labels``: the labels kube-state-metrics was allowed to export
  (``--metric-labels-allowlist``), as ``label_<key>`` with every character outside
  ``[a-zA-Z0-9_]`` written ``_``. The allow-listed prefixes are recognised in that spelling and
  given back theirs; in the rest of a key ``_`` is read as ``-`` (Kubernetes' own keys, and
  those the allow-list names, are written with dashes);
* ``kube_pod_info``'s ``priority_class``.

KSM series are matched on namespace and pod only, not on the fleet's ``--match`` selectors (they
carry no GPU labels); two clusters behind one Thanos with the same namespace and pod names would
be joined as one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from store import intent
from store.schema import Declaration

#: The series read, when present.
SERIES = (
    "kube_pod_owner",
    "kube_pod_labels",
    "kube_pod_info",
    "kube_replicaset_owner",
    "kube_job_owner",
)
Query = Callable[[str], list[dict[str, Any]]]
_NONE = "<none>"
_SANITIZE = re.compile(r"[^a-zA-Z0-9_]")
#: The allow-list as kube-state-metrics spells it: (sanitized prefix, original prefix).
_PREFIXES = tuple(
    (_SANITIZE.sub("_", p), p) for p in (*intent.ALLOWED_PREFIXES, *sorted(intent.ALLOWED_KEYS))
)


def label_key(sanitized: str) -> str | None:
    """The original key of a ``kube_pod_labels`` label (``label_app_kubernetes_io_name`` ->
    ``app.kubernetes.io/name``), or ``None`` when it is not allow-listed."""
    if not sanitized.startswith("label_"):
        return None
    key = sanitized[len("label_") :]
    for short, original in _PREFIXES:
        if key == short and original in intent.ALLOWED_KEYS:
            return original
        if key.startswith(short) and original.endswith("/") and len(key) > len(short):
            return original + key[len(short) :].replace("_", "-")
    return None


def declarations(
    query: Query, pods: dict[tuple[str, str], set[str]], names: set[str], window: str, at: float
) -> list[Declaration]:
    """Declarations for ``pods`` ((namespace, pod) -> the nodes it held GPUs on), from the KSM
    series in ``names``, over ``window`` (a PromQL duration) ending at ``at``."""
    if not pods or not names & {"kube_pod_owner", "kube_pod_labels"}:
        return []
    ask = _Asker(query, "|".join(sorted({ns for ns, _ in pods})), window, names)
    owners = ask.by("kube_pod_owner", ("namespace", "pod"))
    labels = ask.by("kube_pod_labels", ("namespace", "pod"))
    info = ask.by("kube_pod_info", ("namespace", "pod"))
    parents = {
        "ReplicaSet": ask.by("kube_replicaset_owner", ("namespace", "replicaset")),
        "Job": ask.by("kube_job_owner", ("namespace", "job_name")),
    }
    out = []
    for (namespace, pod), nodes in sorted(pods.items()):
        if (namespace, pod) not in owners and (namespace, pod) not in labels:
            continue
        kept = _labels(labels.get((namespace, pod), []))
        chain = _chain(namespace, owners.get((namespace, pod), []), parents, kept)
        priority = next((m.get("priority_class") for m in info.get((namespace, pod), [])), None)
        out += [
            _declaration(node, namespace, pod, chain, kept, priority, at) for node in sorted(nodes)
        ]
    return out


class _Asker:
    def __init__(self, query: Query, namespaces: str, window: str, names: set[str]) -> None:
        self.query, self.namespaces, self.window, self.names = query, namespaces, window, names

    def by(self, series: str, keys: tuple[str, str]) -> dict[tuple[str, str], list[dict[str, str]]]:
        """The series' label sets over the window, by two of their labels."""
        if series not in self.names:
            return {}
        selector = f'{series}{{namespace=~"{self.namespaces}"}}'
        out: dict[tuple[str, str], list[dict[str, str]]] = {}
        for r in self.query(f"max_over_time({selector}[{self.window}])"):
            metric = r.get("metric", {})
            key = (metric.get(keys[0], ""), metric.get(keys[1], ""))
            out.setdefault(key, []).append(metric)
        return out


def _controller(metrics: list[dict[str, str]]) -> tuple[str, str] | None:
    real = [m for m in metrics if m.get("owner_kind") not in (None, "", _NONE)]
    if not real:
        return None
    m = next((m for m in real if m.get("owner_is_controller") == "true"), real[0])
    return m["owner_kind"], m.get("owner_name", "")


def _chain(
    namespace: str,
    pod_owners: list[dict[str, str]],
    parents: dict[str, dict[tuple[str, str], list[dict[str, str]]]],
    labels: dict[str, str],
) -> list[tuple[str, str]]:
    owner = _controller(pod_owners)
    chain = [owner] if owner else []
    if owner and owner[0] in parents:
        parent = _controller(parents[owner[0]].get((namespace, owner[1]), []))
        if parent is None and owner[0] == "ReplicaSet":
            name = intent.deployment_of(owner[1], None)
            parent = ("Deployment", name) if name else None
        elif parent is None:
            name = intent.cronjob_of(owner[1])
            parent = ("CronJob", name) if name else None
        chain += [parent] if parent else []
    named = intent.label_owner(labels)
    top = chain[-1][0] if chain else "Pod"
    if named and intent.strength(named[0], intent.KUBE_STATE_METRICS) > intent.strength(
        top, intent.KUBE_STATE_METRICS
    ):
        chain.append(named)
    return chain


def _labels(metrics: list[dict[str, str]]) -> dict[str, str]:
    out = {}
    for m in metrics:
        for k, v in m.items():
            key = label_key(k)
            if key is not None and v:
                out[key] = v
    return out


def _declaration(
    node: str,
    namespace: str,
    pod: str,
    chain: list[tuple[str, str]],
    labels: dict[str, str],
    priority: str | None,
    at: float,
) -> Declaration:
    kind, name = chain[-1] if chain else ("Pod", pod)
    return Declaration(
        node=node,
        subject=f"pod:{namespace}/{pod}",
        source=intent.KUBE_STATE_METRICS,
        kind=kind,
        name=f"{namespace}/{name}",
        implies=intent.implied(kind),
        attributes=intent.attributes_json(
            {"owners": [f"{k}/{n}" for k, n in chain], "labels": labels, "priority_class": priority}
        ),
        last_seen_ts=at,
    )
