"""The agent's trailing analysis, run in a child process every ``analysis_interval``.

Why a child: the analysis loads the trailing window into DuckDB, runs every detector and imports
the whole analyzer; in the agent's own process that would stay resident between runs (Python
keeps imported modules, allocators keep freed memory, DuckDB's code pages stay mapped), and a
per-node agent is judged by its steady footprint. A child costs about 0.3 s of CPU to start
every 10 minutes (0.0005 cores) and gives everything back when it exits.

Protocol: the agent writes one JSON request on the child's stdin (store, window, thresholds)
and reads a JSON list of :class:`store.schema.GpuAnalysis` rows from its stdout. Exit 0: the
rows; exit 3: the window holds nothing to analyze; else the one ``aiscope:`` line on stderr says
why.

    python -m aiscope.trailing < request.json
"""

from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from analyzer.thresholds import Thresholds
from store.errors import AiscopeError, Failure
from store.schema import GpuAnalysis

#: The child's exit code for "the window holds nothing to analyze" (not a failure).
EMPTY = 3


class TrailingFailed(Failure):
    """The analysis child failed, timed out or answered something unreadable."""


@dataclasses.dataclass(frozen=True, slots=True)
class ChildRun:
    """What one analysis child returned, and what it cost."""

    results: list[GpuAnalysis]
    peak_rss_bytes: int  #: the largest RSS of any child the agent has waited for so far


def request(path: Path, window_seconds: float, thresholds: Thresholds) -> str:
    return json.dumps(
        {
            "store": str(path),
            "window_seconds": window_seconds,
            "thresholds": dataclasses.asdict(thresholds),
        }
    )


def analyze_in_child(
    path: Path, window_seconds: float, thresholds: Thresholds, timeout_seconds: float = 300.0
) -> ChildRun | None:
    """The trailing analysis of ``path`` in a child process; ``None`` when there is nothing to
    analyze. Raises :class:`TrailingFailed` with the child's own one-line reason."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "aiscope.trailing"],
            input=request(path, window_seconds, thresholds),
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise TrailingFailed(f"trailing analysis took over {timeout_seconds:.0f} s") from None
    except OSError as exc:
        raise TrailingFailed(f"cannot start the trailing analysis: {exc}") from None
    if done.returncode == EMPTY:
        return None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        raise TrailingFailed(lines[-1].removeprefix("aiscope: "))
    return ChildRun(_rows(done.stdout), _children_peak_rss_bytes())


def _rows(text: str) -> list[GpuAnalysis]:
    try:
        return [GpuAnalysis(**row) for row in json.loads(text)]
    except (ValueError, TypeError) as exc:
        raise TrailingFailed(f"unreadable answer from the trailing analysis: {exc}") from None


def _children_peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux


def _analyze(raw: dict[str, Any]) -> list[GpuAnalysis]:
    from analyzer.live import trailing  # noqa: PLC0415  (only the child loads the analyzer)

    return trailing(
        Path(raw["store"]), float(raw["window_seconds"]), Thresholds(**raw["thresholds"])
    )


def main() -> int:
    """The child: a request on stdin, the rows on stdout."""
    from analyzer.load import EmptyStore  # noqa: PLC0415

    raw = json.loads(sys.stdin.read())
    try:
        results = _analyze(raw)
    except EmptyStore:
        return EMPTY
    except AiscopeError as exc:
        print(f"aiscope: {exc}", file=sys.stderr)
        return exc.exit_code
    json.dump([dataclasses.asdict(r) for r in results], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
