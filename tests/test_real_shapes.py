"""The classifier on captures in the shapes of real production telemetry (held out from tuning).

* An 8-GPU training run sampled every 100 ms by ``nvidia-smi -lms 100`` with no index column:
  every row has its own millisecond timestamp; ranks stall together on data loading and pass
  through all-reduces together.
* Serving pods sampled once a minute with utilization and memory only, in the shape of the
  Alibaba 2026 Stable-Diffusion serving trace: half of the samples at 0%, p90 around 25%,
  16-30 GiB resident, load following the day.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.analysis import analyze
from tests.conftest import REPO

START = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC).timestamp()


def _stamp(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def _training_capture(path: Path, minutes: int = 40) -> None:
    rng = random.Random(5)
    lines = ["timestamp, utilization.gpu [%], memory.used [MiB], power.draw [W]"]
    for sweep in range(minutes * 600):
        t = START + sweep * 0.1
        loading = (t % 30.0) < 1.5  # every rank waits for the next shard together
        allreduce = (t % 1.1) > 0.85
        for gpu in range(8):
            if loading:
                util, power = rng.choice([0, 0, 3]), 110 + rng.random() * 20
            elif allreduce:
                util, power = 100, 260 + rng.random() * 40
            else:
                util, power = 100 - rng.choice([0, 0, 1, 2]), 560 + rng.random() * 80
            stamp = _stamp(t + gpu * 0.003 + rng.random() * 0.001)
            lines.append(f"{stamp}, {util} %, {71210 + gpu * 3} MiB, {power:.2f} W")
    path.write_text("\n".join(lines) + "\n")


def _serving_capture(path: Path, days: int = 2) -> None:
    rng = random.Random(8)
    lines = ["timestamp, uuid, utilization.gpu [%], memory.used [MiB]"]
    pods = [(f"GPU-{i:08x}-5d5d-4e4e-8f8f-{i:012x}", 16000 + 3500 * i) for i in range(4)]
    for minute in range(days * 1440):
        t = START + minute * 60
        hour = (t % 86400) / 3600.0
        level = 0.55 + 0.45 * math.cos(2 * math.pi * (hour - 15) / 24)
        for uuid, memory in pods:
            busy = rng.random() < 0.55 * level + 0.05
            util = int(min(rng.expovariate(1 / (14 * level + 4)), 100)) if busy else 0
            lines.append(f"{_stamp(t + rng.random())}, {uuid}, {util} %, {memory} MiB")
    path.write_text("\n".join(lines) + "\n")


def _import(store: Path, capture: Path, node: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiscope",
            "import",
            "nvidia-smi",
            str(capture),
            "--store",
            str(store),
            "--node",
            node,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("real")
    training, serving = base / "train.csv", base / "serve.csv"
    _training_capture(training)
    _serving_capture(serving)
    return training, serving


def test_100ms_training_capture_without_index_is_training(captures, tmp_path: Path) -> None:
    store = tmp_path / "t.duckdb"
    _import(store, captures[0], "dgx-07")
    doc = analyze([str(store)], since="7d")
    assert len(doc["gpus"]) == 8
    assert [g["class"] for g in doc["gpus"]] == ["training"] * 8
    assert any("8 GPUs in lockstep" in e for e in doc["gpus"][0]["evidence"])


def test_minute_serving_capture_with_utilization_and_memory_only_is_inference(
    captures, tmp_path: Path
) -> None:
    store = tmp_path / "s.duckdb"
    _import(store, captures[1], "sd-pool")
    doc = analyze([str(store)], since="7d")
    assert len(doc["gpus"]) == 4
    assert [g["class"] for g in doc["gpus"]] == ["inference"] * 4
