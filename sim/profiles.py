"""Device profiles for virtual GPUs: what each model reports, and what its generation supports.

Values follow NVIDIA's datasheets and real ``nvidia-smi -q -x`` dumps (the A100-SXM4-80GB dump in
``shared/data/nvidia-smi-xml`` reports 81920 MiB total, 869 MiB reserved with MIG on, 1410 MHz SM
and 1593 MHz memory clocks). Memory totals are what ``nvmlDeviceGetMemoryInfo`` reports, which is
a little under the marketing size.

The support matrix is per generation: GPM (SM activity, tensor activity) exists from Hopper on;
per-process utilization is not reported for MIG-enabled GPUs; Ada boards have no NVLink and no
MIG.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import BadInput

MIB = 1024 * 1024


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
