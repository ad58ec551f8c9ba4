"""The driver's runs on disk (:mod:`analyzer.spill`, issue #25): what is written reads back
equal, a mapping over them reads each GPU once while it is in use and keeps no more than its
cache, a disk that cannot take them keeps them in memory (said once), and exact sums fed in
parts give :func:`math.fsum`'s float (:mod:`analyzer.exact`)."""

from __future__ import annotations

import logging
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.exact import ExactSum
from analyzer.load import Bucket, BucketRun, TenantBucket, TenantRun
from analyzer.spill import Spill, Spilled


def _run(gpu: int, n: int = 2016) -> BucketRun:
    """A week of one GPU at 5-minute buckets; utilization missing every fourth bucket, four
    fields never reported (a run that crossed processes holds no rows for those)."""
    return BucketRun.of(
        Bucket(
            300.0 * i,
            30,
            30,
            None if i % 4 == 0 else 0.01 * gpu,
            0.9,
            0.1,
            4e10,
            8e10,
            300.0 + gpu,
            0.5,
            None,
        )
        for i in range(n)
    )


def _tenants(gpu: int) -> TenantRun:
    return TenantRun.of(
        TenantBucket(300.0 * i, f"job-{gpu}-{i // 100}", 4e10, None) for i in range(500)
    )


class _Counting(Spill):
    """A spill that counts its reads."""

    def __init__(self, folder: str | None = None) -> None:
        super().__init__(folder)
        self.reads: list[Any] = []

    def get(self, key: Any) -> Any:
        self.reads.append(key)
        return super().get(key)


def test_runs_read_back_equal_from_an_unlinked_file(tmp_path: Path) -> None:
    spill = Spill(str(tmp_path))
    runs = {f"GPU-{i}": _run(i) for i in range(5)}
    tenancy = {f"GPU-{i}": _tenants(i) for i in range(5)}
    buckets = Spilled.write(spill, "buckets", runs)
    tenants = Spilled.write(spill, "tenancy", tenancy)  # the same keys, under another name
    assert list(tmp_path.iterdir()) == []  # nothing left to clean up, even after kill -9
    assert spill.size_bytes > 0
    assert list(buckets) == list(runs) and len(buckets) == 5 and "GPU-3" in buckets
    assert "GPU-9" not in buckets and buckets.get("GPU-9", ()) == ()
    for uuid, run in runs.items():
        back = buckets[uuid]
        assert isinstance(back, BucketRun) and back == run
        assert np.array_equal(back.column("util"), run.column("util"), equal_nan=True)
        assert tenants[uuid] == tenancy[uuid] and tenants[uuid].names == tenancy[uuid].names
    with pytest.raises(KeyError):
        buckets["GPU-9"]
    spill.close()


def test_a_mapping_reads_a_gpu_once_while_in_use_and_keeps_only_its_cache() -> None:
    spill = _Counting()
    buckets = Spilled.write(spill, "buckets", {f"GPU-{i}": _run(i, 10) for i in range(10)}, 3)
    for _ in range(4):  # one GPU asked for in several places in a row: read once
        assert buckets["GPU-1"][0].power_watts == 301.0
    assert [key[-1] for key in spill.reads] == ["GPU-1"]
    for uuid in buckets:  # a walk over the fleet reads each GPU once
        buckets[uuid]
    assert len(spill.reads) == 10  # GPU-1 was still cached
    assert len(buckets._recent) == 3  # the cache, not the fleet
    buckets["GPU-0"]  # long gone from the cache: read again
    assert spill.reads[-1][-1] == "GPU-0" and len(spill.reads) == 11


def test_joined_parts_read_from_one_spill_in_the_order_asked() -> None:
    spill = Spill()
    first = Spilled.write(spill, "tenancy", {"GPU-b": _tenants(1), "GPU-d": _tenants(2)})
    second = Spilled.write(spill, "tenancy", {"GPU-a": _tenants(3), "GPU-c": _tenants(4)})
    assert list(Spilled.join([first, second])) == ["GPU-b", "GPU-d", "GPU-a", "GPU-c"]
    joined = Spilled.join([first, second], sorted(["GPU-b", "GPU-d", "GPU-a", "GPU-c"]))
    assert list(joined) == ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]
    assert joined["GPU-c"] == _tenants(4)
    with pytest.raises(ValueError, match="does not hold"):
        Spilled.join([first, second], ["GPU-a"])
    other = Spilled.write(Spill(), "tenancy", {"GPU-e": _tenants(5)})
    with pytest.raises(ValueError, match="different spills"):
        Spilled.join([first, other])
    assert len(Spilled.join([])) == 0


def test_a_key_in_two_parts_stands_for_the_last_parts_value_as_a_dict_merge() -> None:
    """A GPU whose uuid shows under two nodes of two batches: the driver writes the batches as
    they come back (here the second first), and the join still gives the later batch's run,
    as merging the batches' dicts in order did."""
    spill = Spill()
    second = Spilled.write(spill, "buckets", {"GPU-x": _run(2, 5), "GPU-z": _run(3, 5)})
    first = Spilled.write(spill, "buckets", {"GPU-a": _run(0, 5), "GPU-x": _run(1, 5)})
    joined = Spilled.join([first, second])
    merged = {
        **{"GPU-a": _run(0, 5), "GPU-x": _run(1, 5)},
        **{"GPU-x": _run(2, 5), "GPU-z": _run(3, 5)},
    }
    assert list(joined) == list(merged) == ["GPU-a", "GPU-x", "GPU-z"]
    assert dict(joined.items()) == merged


def test_a_spilled_mapping_sent_elsewhere_takes_its_values_along() -> None:
    buckets = Spilled.write(Spill(), "buckets", {"GPU-0": _run(0, 12), "GPU-1": _run(1, 12)})
    back = pickle.loads(pickle.dumps(buckets))
    assert type(back) is dict and back == {"GPU-0": _run(0, 12), "GPU-1": _run(1, 12)}


class _Full:
    """``/dev/full`` as the spill's file: every write fails with ENOSPC, as on a full disk."""

    def __init__(self) -> None:
        self._file = open("/dev/full", "r+b")  # noqa: SIM115  (closed by the spill)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_keeps_the_runs_in_memory_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spill = Spill()
    monkeypatch.setattr(spill, "_open", _Full)
    runs = {f"GPU-{i}": _run(i, 20) for i in range(3)}
    with caplog.at_level(logging.WARNING, logger="analyzer.spill"):
        buckets = Spilled.write(spill, "buckets", runs)
    assert dict(buckets.items()) == runs  # the same runs, from memory
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert "cannot write the driver's runs" in warned[0] and "No space left" in warned[0]
    assert "TMPDIR" in warned[0]


def test_a_folder_that_is_not_there_keeps_the_runs_in_memory(tmp_path: Path) -> None:
    spill = Spill(str(tmp_path / "gone"))
    tenancy = {"GPU-0": _tenants(0)}
    assert dict(Spilled.write(spill, "tenancy", tenancy).items()) == tenancy
    assert spill.size_bytes == 0


_FINITE = st.floats(allow_nan=False, allow_infinity=False)


@given(st.lists(st.lists(_FINITE, max_size=40), max_size=6))
def test_an_exact_sum_fed_in_parts_is_fsums_float(parts: list[list[float]]) -> None:
    total = ExactSum()
    for part in parts:
        total.add(np.array(part, dtype=np.float64))
    values = [v for part in parts for v in part]
    assert total.count == len(values)
    try:
        expected = math.fsum(values)
    except OverflowError:  # an intermediate sum past the largest float: fsum gives none
        return
    assert total.value == expected


def test_an_exact_sum_of_many_values_across_exponents() -> None:
    rng = np.random.default_rng(7)
    values = rng.random(200_000) * 10.0 ** rng.integers(-300, 300, 200_000)
    values[::7] *= -1
    total = ExactSum()
    for part in np.array_split(values, 13):
        total.add(part)
    assert total.value == math.fsum(values.tolist())


def test_infinities_and_nan_make_the_sum_theirs() -> None:
    total = ExactSum()
    total.add(np.array([1.0, math.inf, 2.0]))
    assert total.value == math.inf and total.count == 3
    total.add(np.array([-math.inf]))
    assert math.isnan(total.value)
    empty = ExactSum()
    empty.add(np.array([]))
    assert empty.value == 0.0 and empty.count == 0
