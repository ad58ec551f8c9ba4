"""MIG instances as GPUs of their own, and their partitioned parents.

A MIG instance (a ``MIG-…`` device with a ``parent_uuid``) is classified like any GPU; its
partitioned parent is not, or every GPU-hour on it would be counted twice (:func:`fold` drops it
from the GPUs and keeps its buckets for what only the physical GPU reports: power).

Power is per physical GPU: the instances share it. Hopper reports each instance's activity (GPM),
so its power is never needed there. Ampere reports nothing per instance, so :func:`fold` gives an
instance the parent's power only where the attribution is exact, and leaves it ``None`` (unknown,
never zero) where it is not:

* the parent at its idle floor: every instance drew nothing above idle (a sum of non-negative
  draws that is zero);
* one instance holding memory: the whole draw above idle is its own (an empty instance runs no
  kernels);
* two or more holding memory: unknown, since splitting by slices would lend a silent notebook
  part of a busy neighbour's power.

An instance's power is its draw *above the GPU's idle floor* (the parent's lowest bucket): the
idle draw belongs to the board, not to a slice, and is counted once, on no instance. It is read
against the instance's share of the dynamic range (``k`` of 7 compute slices) as its
:attr:`GpuInfo.power_limit_watts`, so a ``3g`` slice at full tilt reads as fully loaded. The
evidence says the power was apportioned (:func:`evidence`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analyzer.load import Bucket, GpuInfo

COMPUTE_SLICES = 7
#: Power within this share of the dynamic range above the floor counts as "at idle".
IDLE_MARGIN_RATIO = 0.02
#: An instance holds its memory from this share of it on (the classifier's own rule is finer).
HELD_RATIO = 0.02
_SLICES = re.compile(r"^(\d+)g\.")
#: How imports name an instance they cannot ask the driver about: ``<parent UUID>/gi<N>``
#: (``import dcgm``, ``import nvidia-smi-xml``, ``--prometheus``), and NVML's device name.
_IMPORTED = re.compile(r"^(?P<parent>.+)/gi(?P<gi>\d+)$")
_NAMED = re.compile(r"\bMIG\s+(?P<profile>\d+g\.\d+gb)", re.IGNORECASE)


def identity(
    uuid: str, name: str | None, parent: str | None, profile: str | None, gi: int | None
) -> tuple[str | None, str | None, int | None]:
    """(parent uuid, profile, GPU-instance id) of a device: the store's MIG columns, else what
    an imported instance's uuid and name say; ``(None, None, None)`` for a whole GPU."""
    imported = _IMPORTED.match(uuid)
    if parent is None and imported is not None:
        parent, gi = imported.group("parent"), int(imported.group("gi"))
    if parent is None:
        return None, None, None
    named = _NAMED.search(name or "")
    return parent, profile or (named.group("profile").lower() if named else None), gi


def slices(profile: str | None) -> int | None:
    """Compute slices of a GPU-instance profile (``3g.40gb`` -> 3); ``None`` when unknown."""
    found = _SLICES.match(profile or "")
    return int(found.group(1)) if found else None


def fold(
    gpus: Sequence[GpuInfo], buckets: Mapping[str, Sequence[Bucket]]
) -> tuple[list[GpuInfo], dict[str, Sequence[Bucket]]]:
    """The GPUs to classify (partitioned parents dropped) and their buckets, with Ampere
    instances given the parent's power where it is exactly theirs. Only an instance's buckets
    are copied (to lists, changed in place); a whole GPU's are passed on as they came."""
    parents = {g.parent_uuid for g in gpus if g.parent_uuid}
    by_uuid = {g.uuid: g for g in gpus}
    out_gpus: list[GpuInfo] = []
    out_buckets: dict[str, Sequence[Bucket]] = dict(buckets)
    for gpu in gpus:
        if gpu.uuid in parents and gpu.parent_uuid is None:
            continue
        out_gpus.append(gpu)
    parent_buckets = {uuid: out_buckets.pop(uuid, []) for uuid in parents if uuid}
    for parent_uuid in parents:
        parent = by_uuid.get(parent_uuid or "")
        children = [g for g in out_gpus if g.parent_uuid == parent_uuid]
        copied = {g.uuid: list(out_buckets.get(g.uuid, ())) for g in children}
        out_buckets.update(copied)
        # An instance's own power, if a source gave one, is its board's (dcgm-exporter repeats
        # the GPU's power on every MIG series): never the instance's evidence as such.
        powerless = {g.uuid: _without_power(g, copied[g.uuid]) for g in children}
        if parent is not None and _needs_power(children, copied):
            apportioned = _apportion(parent, children, parent_buckets[parent.uuid], copied)
            powerless.update(apportioned)
        out_gpus = [powerless.get(g.uuid, g) for g in out_gpus]
    return out_gpus, out_buckets


def _without_power(gpu: GpuInfo, buckets: list[Bucket]) -> GpuInfo:
    for i, b in enumerate(buckets):
        if b.power_watts is not None:
            buckets[i] = b._replace(power_watts=None)
    return dataclasses.replace(gpu, power_limit_watts=None)


def is_apportioned(gpu: GpuInfo) -> bool:
    """Whether ``gpu`` is a MIG instance whose power was apportioned from its parent."""
    return gpu.parent_uuid is not None and gpu.power_limit_watts is not None


def evidence(gpu: GpuInfo) -> str | None:
    """The sentence that says where a MIG instance's evidence came from."""
    if gpu.parent_uuid is None:
        return None
    if is_apportioned(gpu):
        return (
            f"MIG {gpu.mig_profile}: no per-instance activity on this GPU (no GPM), so power "
            "is the parent's, counted only while this slice alone held memory or the GPU idled"
        )
    return f"MIG {gpu.mig_profile}: activity from GPM per instance (power is the parent's)"


def _needs_power(children: list[GpuInfo], buckets: Mapping[str, Sequence[Bucket]]) -> bool:
    """No child reports utilization (Ampere, or a driver without GPM)."""
    return bool(children) and all(
        b.util_max is None for g in children for b in buckets.get(g.uuid, ())
    )


def _apportion(
    parent: GpuInfo,
    children: list[GpuInfo],
    parent_buckets: Sequence[Bucket],
    buckets: dict[str, list[Bucket]],
) -> dict[str, GpuInfo]:
    """Give each child the parent's power in the buckets where it is exactly attributable;
    returns the children with their share of the dynamic range as their power limit."""
    power = {b.start: b.power_watts for b in parent_buckets if b.power_watts is not None}
    if not power or not parent.power_limit_watts:
        return {}
    floor = min(power.values())
    span = max(parent.power_limit_watts - floor, 1.0)
    where = {g.uuid: {b.start: i for i, b in enumerate(buckets[g.uuid])} for g in children}
    for start, watts in power.items():
        own = {g.uuid: where[g.uuid].get(start) for g in children}
        holders = [g for g in children if _holds(g, buckets[g.uuid], own[g.uuid])]
        idle = watts - floor <= IDLE_MARGIN_RATIO * span
        owner = holders[0].uuid if len(holders) == 1 else None
        for g in children:
            i = own[g.uuid]
            if i is not None:
                mine = watts - floor if g.uuid == owner else 0.0 if idle else None
                buckets[g.uuid][i] = buckets[g.uuid][i]._replace(power_watts=mine)
    return {
        g.uuid: dataclasses.replace(
            g, power_limit_watts=span * (slices(g.mig_profile) or 1) / COMPUTE_SLICES
        )
        for g in children
    }


def _holds(gpu: GpuInfo, buckets: list[Bucket], i: int | None) -> bool:
    memory = None if i is None else buckets[i].memory_bytes
    if memory is None:
        return False
    total = gpu.memory_total_bytes
    return memory > (HELD_RATIO * total if total else float(1 << 30))


def mig_json(gpu: GpuInfo) -> dict[str, dict[str, str | int | None]]:
    """The contract's ``"mig"`` object of a ``gpus[]`` entry (nothing for a whole GPU), with
    the GPU-instance id that tells two instances of one profile apart."""
    if gpu.parent_uuid is None:
        return {}
    return {
        "mig": {
            "parent_uuid": gpu.parent_uuid,
            "profile": gpu.mig_profile,
            "gpu_instance_id": gpu.gpu_instance_id,
        }
    }
