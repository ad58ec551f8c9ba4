"""Import speed: `python bench/import_nvidia_smi.py [--rows 170000]`.

Writes a realistic `nvidia-smi --query-gpu=... --format=csv -lms 100` capture of 8 GPUs with
units in the header and values (about 24 MB for 170k rows), imports it into a fresh store, and
imports it again (all duplicates). Baseline, measured in the same run: only reading the file with
Python's csv module, the floor for any streaming importer written in Python.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import logging
import resource
import sys
import tempfile
import time
from pathlib import Path

from agent.store import Store
from ingest.importer import import_files

HEADER = (
    "timestamp, index, uuid, name, pci.bus_id, utilization.gpu [%], utilization.memory [%], "
    "memory.used [MiB], memory.total [MiB], power.draw [W], power.limit [W], "
    "temperature.gpu, clocks.sm [MHz], clocks.mem [MHz], "
    "clocks_event_reasons.active"
)


def write_capture(path: Path, rows: int) -> None:
    start = dt.datetime(2025, 7, 27, tzinfo=dt.UTC).timestamp()
    with path.open("w") as f:
        f.write(HEADER + "\n")
        for i in range(rows):
            gpu, sweep = i % 8, i // 8
            stamp = dt.datetime.fromtimestamp(start + sweep * 0.1 + gpu * 0.002, dt.UTC)
            util = 60 + (sweep * 7 + gpu * 13) % 40
            f.write(
                f"{stamp.strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]}, {gpu}, "
                f"GPU-{gpu:08x}-aaaa-bbbb-cccc-dddddddddddd, NVIDIA H100 80GB HBM3, "
                f"00000000:{0x18 + gpu * 16:02X}:00.0, {util} %, {util // 2} %, "
                f"{60000 + gpu} MiB, 81559 MiB, {300 + util * 3}.25 W, 700.00 W, {40 + util // 4}, "
                f"1980 MHz, 2619 MHz, 0x0000000000000000\n"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=170_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        capture = Path(tmp) / "capture.csv"
        write_capture(capture, args.rows)
        size_mb = capture.stat().st_size / 1e6
        started = time.perf_counter()
        with capture.open(newline="") as f:
            baseline_rows = sum(1 for _ in csv.reader(f))
        baseline = time.perf_counter() - started

        store = Store(Path(tmp) / "s.duckdb")
        started = time.perf_counter()
        first = import_files([capture], store, "bench", None)
        first_s = time.perf_counter() - started
        started = time.perf_counter()
        again = import_files([capture], store, "bench", None)
        again_s = time.perf_counter() - started
        store.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"capture: {args.rows} rows, {size_mb:.1f} MB, 8 GPUs")
    print(
        f"import:            {first_s:.2f} s ({args.rows / first_s:,.0f} rows/s), "
        f"{first.samples_written} samples written"
    )
    print(
        f"import again:      {again_s:.2f} s, {again.samples_written} written, "
        f"{again.duplicates} already stored"
    )
    print(
        f"baseline csv read: {baseline:.2f} s ({baseline_rows} lines); import/baseline "
        f"{first_s / baseline:.1f}x"
    )
    print(f"peak RSS:          {peak:.0f} MiB (DuckDB streams the file; this process wrote it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
