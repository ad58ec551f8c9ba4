"""Pod names for the pod UIDs that attribution finds in cgroup paths, from the Kubernetes API.

Attribution reads a GPU process's pod UID from its cgroup path, with no privilege and no network.
Names (namespace/name) come from the API server: the agent lists the pods on its own node
(``GET /api/v1/pods?fieldSelector=spec.nodeName=NODE``) with its service account, every minute.
We chose the API server over the kubelet's pod-resources socket because it needs only a
``list pods`` RBAC rule and no hostPath socket mount, and it works without device plugins.

When the API server cannot be reached (not in a cluster, RBAC missing, network policy), the
failure is logged once and counted, and attribution keeps working with pod UIDs.
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

from store.errors import AiscopeError
from store.schema import Pod

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True, slots=True)
class PodName:
    uid: str
    namespace: str
    name: str
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
        return [Pod(self.node, p.uid, p.namespace, p.name, now) for p in pods]

    def _fetch(self) -> list[PodName]:
        query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={self.node}"})
        request = urllib.request.Request(f"{self._url}/api/v1/pods?{query}")
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
        return _pod_names(body)


def _pod_names(body: object) -> list[PodName]:
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        raise PodDirectoryError("the API server's answer is not a PodList")
    out = []
    for item in body["items"]:
        meta = item.get("metadata", {}) if isinstance(item, dict) else {}
        uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        if isinstance(uid, str) and isinstance(namespace, str) and isinstance(name, str):
            out.append(PodName(uid, namespace, name, _containers(item)))
    return out


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
