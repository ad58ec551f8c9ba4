"""Device profiles for virtual GPUs: what each model reports, and what its generation supports.

Values follow NVIDIA's datasheets and real ``nvidia-smi -q -x`` dumps (the A100-SXM4-80GB dump in
``shared/data/nvidia-smi-xml`` reports 81920 MiB total, 869 MiB reserved with MIG on, 1410 MHz SM
and 1593 MHz memory clocks). Memory totals are what ``nvmlDeviceGetMemoryInfo`` reports, which is
a little under the marketing size.

The support matrix is per generation: GPM (SM activity, tensor activity) exists from Hopper on,
for the whole GPU and for each MIG instance (``nvmlGpmMigSampleGet``); per-process utilization is
not reported for MIG-enabled GPUs; Ada boards have no NVLink and no MIG.

MIG profiles (:data:`MIG_PROFILES`) carry the sizes ``nvidia-smi mig -lgip`` prints for each
model (NVIDIA's MIG User Guide, "Supported MIG Profiles"): a ``1g.10gb`` instance of an
A100-80GB reports 9.5 GiB, a ``3g.40gb`` 39.25 GiB. A layout is valid when its compute slices fit
the 7 of the GPU and its memory slices the 8 (each profile's share of the memory, the rule the
driver's placements follow), and no profile exceeds its per-GPU count.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.errors import BadInput

MIB = 1024 * 1024
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of one model: its name, slices, memory and the driver's id."""

    name: str
    compute_slices: int
    memory_slices: int
    memory_total_bytes: int
    per_gpu: int
    profile_id: int


def _mig(*rows: tuple[str, int, int, float, int, int]) -> dict[str, MigProfile]:
    return {r[0]: MigProfile(r[0], r[1], r[2], int(r[3] * 1024) * MIB, r[4], r[5]) for r in rows}


#: GPU-instance profiles per profile key: (name, compute slices, memory slices, GiB the instance
#: reports, per GPU, ``NVML_GPU_INSTANCE_PROFILE_*`` id).
MIG_PROFILES: dict[str, dict[str, MigProfile]] = {
    "A100-40GB": _mig(
        ("1g.5gb", 1, 1, 4.75, 7, 0),
        ("1g.10gb", 1, 2, 9.75, 4, 9),
        ("2g.10gb", 2, 2, 9.75, 3, 1),
        ("3g.20gb", 3, 4, 19.62, 2, 2),
        ("4g.20gb", 4, 4, 19.62, 1, 3),
        ("7g.40gb", 7, 8, 39.38, 1, 4),
    ),
    "A100-80GB": _mig(
        ("1g.10gb", 1, 1, 9.5, 7, 0),
        ("1g.20gb", 1, 2, 19.5, 4, 9),
        ("2g.20gb", 2, 2, 19.5, 3, 1),
        ("3g.40gb", 3, 4, 39.25, 2, 2),
        ("4g.40gb", 4, 4, 39.25, 1, 3),
        ("7g.80gb", 7, 8, 79.25, 1, 4),
    ),
    "H100-80GB": _mig(
        ("1g.10gb", 1, 1, 9.75, 7, 0),
        ("1g.20gb", 1, 2, 19.62, 4, 9),
        ("2g.20gb", 2, 2, 19.62, 3, 1),
        ("3g.40gb", 3, 4, 39.5, 2, 2),
        ("4g.40gb", 4, 4, 39.5, 1, 3),
        ("7g.80gb", 7, 8, 79.25, 1, 4),
    ),
    "H200-141GB": _mig(
        ("1g.18gb", 1, 1, 16.5, 7, 0),
        ("1g.35gb", 1, 2, 32.5, 4, 9),
        ("2g.35gb", 2, 2, 32.5, 3, 1),
        ("3g.71gb", 3, 4, 69.75, 2, 2),
        ("4g.71gb", 4, 4, 69.75, 1, 3),
        ("7g.141gb", 7, 8, 139.75, 1, 4),
    ),
}


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    """Static facts of one GPU model."""

    key: str
    name: str
    architecture: str
    memory_total_bytes: int
    memory_reserved_bytes: int
    power_limit_watts: float
    idle_power_watts: float
    sm_clock_max_mhz: int
    sm_clock_idle_mhz: int
    memory_clock_mhz: int
    nvlink_count: int
    pcie_max_bytes_per_second: float
    mig_profiles: tuple[str, ...]

    @property
    def gpm_supported(self) -> bool:
        return self.architecture in ("hopper", "blackwell")

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)


PROFILES: dict[str, DeviceProfile] = {
    p.key: p
    for p in (
        DeviceProfile(
            "A100-40GB",
            "NVIDIA A100-SXM4-40GB",
            "ampere",
            40960 * MIB,
            634 * MIB,
            400.0,
            55.0,
            1410,
            210,
            1215,
            12,
            25e9,
            ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        ),
        DeviceProfile(
            "A100-80GB",
            "NVIDIA A100-SXM4-80GB",
            "ampere",
            81920 * MIB,
            869 * MIB,
            400.0,
            62.0,
            1410,
            210,
            1593,
            12,
            25e9,
            ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        ),
        DeviceProfile(
            "H100-80GB",
            "NVIDIA H100 80GB HBM3",
            "hopper",
            81559 * MIB,
            579 * MIB,
            700.0,
            72.0,
            1980,
            345,
            2619,
            18,
            50e9,
            ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        ),
        DeviceProfile(
            "H200-141GB",
            "NVIDIA H200",
            "hopper",
            143771 * MIB,
            1027 * MIB,
            700.0,
            76.0,
            1980,
            345,
            3201,
            18,
            50e9,
            ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        ),
        DeviceProfile(
            "L4",
            "NVIDIA L4",
            "ada",
            23034 * MIB,
            451 * MIB,
            72.0,
            16.0,
            2040,
            210,
            6251,
            0,
            25e9,
            (),
        ),
        DeviceProfile(
            "L40S",
            "NVIDIA L40S",
            "ada",
            46068 * MIB,
            583 * MIB,
            350.0,
            36.0,
            2520,
            210,
            9001,
            0,
            25e9,
            (),
        ),
    )
}


class UnknownModel(BadInput, KeyError):
    """No virtual GPU profile has that name (``--virtual-model``, a scenario's ``model``)."""

    def __str__(self) -> str:
        return str(self.args[0])


def profile(key: str) -> DeviceProfile:
    """The profile named ``key``. Raises :class:`UnknownModel` naming the valid keys."""
    try:
        return PROFILES[key]
    except KeyError:
        raise UnknownModel(f"unknown GPU model {key!r}; known: {', '.join(PROFILES)}") from None


def mig_layout(key: str, names: list[str] | tuple[str, ...]) -> tuple[MigProfile, ...]:
    """The MIG instances ``names`` (``["3g.40gb", "1g.10gb", ...]``) on a GPU of model ``key``,
    checked like the driver would: known profiles, slices that fit, per-GPU counts. Raises
    :class:`BadInput` naming the layout and what is wrong."""
    table = MIG_PROFILES.get(key)
    if not table:
        raise BadInput(f"{key} has no MIG profiles (MIG needs an A100, H100 or H200)")
    unknown = [n for n in names if n not in table]
    if unknown:
        raise BadInput(f"unknown MIG profile {unknown[0]!r} for {key}; known: {', '.join(table)}")
    layout = tuple(table[n] for n in names)
    compute = sum(p.compute_slices for p in layout)
    memory = sum(p.memory_slices for p in layout)
    if not layout or compute > MIG_COMPUTE_SLICES or memory > MIG_MEMORY_SLICES:
        raise BadInput(
            f"MIG layout {'+'.join(names) or '(empty)'} does not fit a {key}: "
            f"{compute}/{MIG_COMPUTE_SLICES} compute and {memory}/{MIG_MEMORY_SLICES} "
            "memory slices"
        )
    for p in layout:
        if names.count(p.name) > p.per_gpu:
            raise BadInput(f"MIG layout: at most {p.per_gpu} x {p.name} on a {key}")
    return layout
