"""Pod names for the pod UIDs that attribution finds in cgroup paths, from the Kubernetes API.

Attribution reads a GPU process's pod UID from its cgroup path, with no privilege and no network.
Names (namespace/name) come from the API server: the agent lists the pods on its own node
(``GET /api/v1/pods?fieldSelector=spec.nodeName=NODE``) with its service account, every minute.
We chose the API server over the kubelet's pod-resources socket because it needs only a
``list pods`` RBAC rule and no hostPath socket mount, and it works without device plugins.

When the API server cannot be reached (not in a cluster, RBAC missing, network policy), the
failure is logged once and counted, and attribution keeps working with pod UIDs.

Declared intent (schema 3, ``store.intent``): the same answer gives each pod's owner chain, its
allow-listed labels and annotations and its priority class. The chain is followed upwards by
asking the API server for each owner that can itself be owned (``get`` on ReplicaSets,
StatefulSets, Deployments, Jobs and RayClusters: a ReplicaSet's Deployment, a Deployment's
InferenceService, a Job's CronJob, a StatefulSet's Notebook or LeaderWorkerSet, a RayCluster's
RayJob or RayService). Where that is refused or fails, the controllers' name rules stand in:
a ReplicaSet is ``<deployment>-<pod-template-hash>``, a CronJob's Job is ``<cronjob>-<minute>``;
and the labels purpose-built controllers put on their pods name them (``notebook-name``,
``serving.kserve.io/inferenceservice``, ``leaderworkerset.sigs.k8s.io/name``, KubeRay's
``ray.io/originated-from-crd``). Only allow-listed keys are stored, their values redacted.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.redact import redact_text
from store import intent
from store.errors import AiscopeError
from store.schema import Declaration, Pod

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


#: Owner kinds that can have an owner of their own, and so are looked up.
_OWNED_KINDS = frozenset({"ReplicaSet", "StatefulSet", "Deployment", "Job", "RayCluster"})
#: How far up an owner chain goes (pod -> ReplicaSet -> Deployment -> InferenceService is 3).
_MAX_CHAIN = 4


@dataclass(frozen=True, slots=True)
class Owner:
    """One link of an owner chain, from an ``ownerReferences`` entry."""

    kind: str
    name: str
    api_version: str = ""


@dataclass(frozen=True, slots=True)
class PodName:
    uid: str
    namespace: str
    name: str
    #: The pod's controller owner, as its ownerReferences give it (``None``: a bare pod).
    owner: Owner | None = None
    #: Allow-listed labels and annotations (``store.intent.allowed``), and the priority class.
    labels: tuple[tuple[str, str], ...] = ()
    priority_class: str | None = None
    #: The ``pod-template-hash`` label (not stored: it names the ReplicaSet's Deployment).
    template_hash: str | None = None
    #: (container id, container name) of its containers, from ``status.containerStatuses``
    #: (the id without its ``containerd://`` prefix, as attribution reads it from the cgroup).
    containers: tuple[tuple[str, str], ...] = ()

    def container(self, container_id: str | None) -> str | None:
        """The name of the container ``container_id`` (``None``: not one of this pod's)."""
        return next((name for cid, name in self.containers if cid == container_id), None)


class PodDirectoryError(AiscopeError, RuntimeError):
    """The API server could not be asked, or its answer was not a pod list."""


class PodDirectory:
    """This node's pods by UID, refreshed by :meth:`refresh` (a scheduled job)."""

    def __init__(
        self,
        node: str,
        api_url: str,
        token_path: Path | None = None,
        ca_path: Path | None = None,
        clock: Callable[[], float] = time.time,
        timeout_seconds: float = 5.0,
    ) -> None:
        self.node = node
        self._url = api_url.rstrip("/")
        self._token_path = token_path
        self._context = ssl.create_default_context(cafile=str(ca_path)) if ca_path else None
        self._clock = clock
        self._timeout = timeout_seconds
        self._lock = threading.Lock()
        self._pods: dict[str, PodName] = {}
        self._failures = 0
        self._failing = False
        #: (namespace, kind, name) -> that owner's own controller owner (``None``: it has none),
        #: or absent when not asked yet; owners whose lookup failed are in ``_unresolvable``.
        self._owners: dict[tuple[str, str, str], Owner | None] = {}
        self._unresolvable: set[tuple[str, str, str]] = set()
        self._declarations: list[Declaration] = []

    @classmethod
    def in_cluster(cls, node: str) -> PodDirectory | None:
        """The directory for a pod running in a cluster, or ``None`` outside one."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        token = SERVICE_ACCOUNT / "token"
        if not host or not token.exists():
            return None
        if ":" in host:
            host = f"[{host}]"
        return cls(node, f"https://{host}:{port}", token, SERVICE_ACCOUNT / "ca.crt")

    def lookup(self, uid: str) -> PodName | None:
        with self._lock:
            return self._pods.get(uid)

    def snapshot(self) -> tuple[tuple[PodName, ...], int]:
        """The known pods and the number of failed refreshes so far."""
        with self._lock:
            return tuple(sorted(self._pods.values(), key=lambda p: p.uid)), self._failures

    def refresh(self) -> list[Pod]:
        """Ask the API server again; returns the pods as store records. A failure keeps the last
        good answer, is logged once per failing streak, and is counted."""
        try:
            pods = self._fetch()
        except PodDirectoryError as exc:
            with self._lock:
                self._failures += 1
                first = not self._failing
                self._failing = True
            if first:
                log.warning("pod names unavailable, attributing by pod UID: %s", exc)
            return []
        with self._lock:
            self._pods = {p.uid: p for p in pods}
            if self._failing:
                log.info("pod names available again (%d pods on %s)", len(pods), self.node)
            self._failing = False
        now = self._clock()
        self._declarations = [self._declaration(p, now) for p in pods]
        return [Pod(self.node, p.uid, p.namespace, p.name, now) for p in pods]

    def declarations(self) -> list[Declaration]:
        """What the pods of the last good answer declare (owner chain, labels, priority
        class), as store records: one per pod with an owner, an allow-listed label or a
        priority class."""
        return [d for d in self._declarations if d.kind != "Pod" or d.attributes]

    def _declaration(self, pod: PodName, now: float) -> Declaration:
        chain = self._chain(pod)
        labels = dict(pod.labels)
        top = chain[-1] if chain else None
        kind, name = (top.kind, top.name) if top else ("Pod", pod.name)
        named = intent.label_owner(labels)
        if named is not None and intent.strength(named[0], intent.KUBERNETES) > intent.strength(
            kind, intent.KUBERNETES
        ):
            kind, name = named
        attributes = intent.attributes_json(
            {
                "owners": [f"{o.kind}/{o.name}" for o in chain],
                "labels": labels,
                "priority_class": pod.priority_class,
            }
        )
        return Declaration(
            node=self.node,
            subject=f"pod:{pod.uid}",
            source=intent.KUBERNETES,
            kind=kind,
            name=f"{pod.namespace}/{name}",
            implies=intent.implied(kind),
            attributes=attributes,
            last_seen_ts=now,
        )

    def _chain(self, pod: PodName) -> list[Owner]:
        """The pod's owners from its controller up; each owned kind is asked for its own owner,
        else named by the controllers' name rules."""
        chain: list[Owner] = []
        owner = pod.owner
        while owner is not None and len(chain) < _MAX_CHAIN:
            chain.append(owner)
            owner = self._owner_of(pod, owner) if owner.kind in _OWNED_KINDS else None
        return chain

    def _owner_of(self, pod: PodName, owner: Owner) -> Owner | None:
        key = (pod.namespace, owner.kind, owner.name)
        if key not in self._owners and key not in self._unresolvable:
            try:
                self._owners[key] = _controller(self._get(_object_path(pod.namespace, owner)))
            except PodDirectoryError as exc:
                self._unresolvable.add(key)
                with self._lock:
                    self._failures += 1  # exported with the pod lookups' failures
                if len(self._unresolvable) == 1:  # logged once: RBAC is per cluster, not owner
                    log.warning(
                        "owners not readable, naming them by rule (%s/%s: %s)", *key[1:], exc
                    )
        if key in self._owners:
            return self._owners[key]
        return _owner_by_rule(pod, owner)

    def _fetch(self) -> list[PodName]:
        query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={self.node}"})
        return _pod_names(self._get(f"/api/v1/pods?{query}"))

    def _get(self, path: str) -> object:
        request = urllib.request.Request(f"{self._url}{path}")
        request.add_header("Accept", "application/json")
        if self._token_path is not None:
            try:
                token = self._token_path.read_text().strip()
            except OSError as exc:
                raise PodDirectoryError(f"{self._token_path}: {exc.strerror}") from None
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(
                request, timeout=self._timeout, context=self._context
            ) as response:
                body = json.loads(response.read())
        except (OSError, ValueError) as exc:
            raise PodDirectoryError(f"{self._url}: {exc}") from None
        return body


def _object_path(namespace: str, owner: Owner) -> str:
    """The API path of a namespaced owner: ``/apis/apps/v1/namespaces/ns/replicasets/x``."""
    group = "/api/v1" if owner.api_version in ("", "v1") else f"/apis/{owner.api_version}"
    plural = owner.kind.lower() + "s"
    quote = urllib.parse.quote
    return f"{group}/namespaces/{quote(namespace)}/{plural}/{quote(owner.name)}"


def _controller(body: object) -> Owner | None:
    """The controller owner in an object's ``metadata.ownerReferences`` (the first owner when
    none is marked controller), or ``None``."""
    meta = body.get("metadata") if isinstance(body, dict) else None
    refs = meta.get("ownerReferences") if isinstance(meta, dict) else None
    if not isinstance(refs, list):
        return None
    valid = [r for r in refs if isinstance(r, dict) and isinstance(r.get("kind"), str)]
    valid = [r for r in valid if isinstance(r.get("name"), str)]
    if not valid:
        return None
    ref = next((r for r in valid if r.get("controller") is True), valid[0])
    return Owner(ref["kind"], ref["name"], str(ref.get("apiVersion") or ""))


def _owner_by_rule(pod: PodName, owner: Owner) -> Owner | None:
    """An owner's owner by the controllers' name rules, when the API server was not asked."""
    if owner.kind == "ReplicaSet":
        deployment = intent.deployment_of(owner.name, pod.template_hash)
        return Owner("Deployment", deployment, "apps/v1") if deployment else None
    if owner.kind == "Job":
        cronjob = intent.cronjob_of(owner.name)
        return Owner("CronJob", cronjob, "batch/v1") if cronjob else None
    if owner.kind == "RayCluster":
        labels = dict(pod.labels)
        crd = labels.get("ray.io/originated-from-crd")
        name = labels.get("ray.io/originated-from-cr-name")
        if crd in ("RayJob", "RayService") and name:
            return Owner(crd, name, "ray.io/v1")
    return None


def _pod_names(body: object) -> list[PodName]:
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        raise PodDirectoryError("the API server's answer is not a PodList")
    out = []
    for item in body["items"]:
        meta = item.get("metadata", {}) if isinstance(item, dict) else {}
        uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        if isinstance(uid, str) and isinstance(namespace, str) and isinstance(name, str):
            out.append(_pod_name(item, uid, namespace, name))
    return out


def _pod_name(item: dict[str, Any], uid: str, namespace: str, name: str) -> PodName:
    meta = item["metadata"]
    spec = item.get("spec") if isinstance(item.get("spec"), dict) else {}
    raw_labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    kept = {**intent.keep_allowed(meta.get("annotations")), **intent.keep_allowed(raw_labels)}
    priority = spec.get("priorityClassName") if isinstance(spec, dict) else None
    template_hash = raw_labels.get("pod-template-hash")
    return PodName(
        uid,
        namespace,
        name,
        owner=_controller(item),
        labels=tuple(sorted((k, redact_text(v)) for k, v in kept.items())),
        priority_class=priority if isinstance(priority, str) else None,
        template_hash=template_hash if isinstance(template_hash, str) else None,
        containers=_containers(item),
    )


def _containers(item: dict[str, object]) -> tuple[tuple[str, str], ...]:
    """(id, name) of a pod's running or terminated containers (init containers too): the id
    as ``containerd://3f2a…`` becomes ``3f2a…``; a container not started yet has no id."""
    status = item.get("status")
    if not isinstance(status, dict):
        return ()
    out = []
    for key in ("initContainerStatuses", "containerStatuses"):
        entries = status.get(key)
        for entry in entries if isinstance(entries, list) else ():
            cid = entry.get("containerID") if isinstance(entry, dict) else None
            name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(cid, str) and isinstance(name, str) and cid:
                out.append((cid.rsplit("://", 1)[-1], name))
    return tuple(out)
