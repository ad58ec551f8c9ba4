"""The agent's interval scheduler: cadence, no overlap, coalescing, a failing job kept, a prompt
stop that waits for the running job."""

from __future__ import annotations

import logging
import threading
import time

from hypothesis import given
from hypothesis import strategies as st

from agent.exporter import SkipsCollector, build_registry, render
from agent.schedule import Job, Scheduler, Skips, next_due


@given(
    due=st.floats(0, 1e6),
    interval=st.floats(0.01, 1e4),
    late=st.floats(0, 1e6),
)
def test_next_due_is_the_first_grid_point_after_now(
    due: float, interval: float, late: float
) -> None:
    now = due + late
    later = next_due(due, interval, now)
    assert later >= due
    if now < due:
        assert later == due
    else:
        assert later > now - 1e-6 * max(1.0, now)
        assert later - interval <= now + 1e-6 * max(1.0, now)


def test_jobs_run_on_their_cadence_and_stop_promptly() -> None:
    runs: dict[str, list[float]] = {"fast": [], "slow": []}
    scheduler = Scheduler(
        [
            Job("fast", lambda: runs["fast"].append(time.monotonic()), 0.05),
            Job("slow", lambda: runs["slow"].append(time.monotonic()), 0.2),
        ]
    )
    started = time.monotonic()
    scheduler.start()
    time.sleep(0.55)
    scheduler.shutdown()
    assert time.monotonic() - started < 1.0
    assert 5 <= len(runs["fast"]) <= 11, runs["fast"]  # 10 due; a loaded CI machine may skip
    assert 1 <= len(runs["slow"]) <= 2
    assert runs["fast"][0] - started >= 0.045  # the first run one interval after the start


def test_an_overrunning_job_never_overlaps_and_skips_missed_runs() -> None:
    active, overlaps, count = [0], [0], [0]
    lock = threading.Lock()

    def slow() -> None:
        with lock:
            active[0] += 1
            overlaps[0] = max(overlaps[0], active[0])
        time.sleep(0.12)  # three intervals
        with lock:
            active[0] -= 1
            count[0] += 1

    scheduler = Scheduler([Job("slow", slow, 0.04), Job("tick", lambda: None, 0.01)])
    scheduler.start()
    time.sleep(0.6)
    scheduler.shutdown()
    assert overlaps[0] == 1
    assert 3 <= count[0] <= 5
    assert scheduler.skipped["slow"] >= 2 * count[0] - 2


def test_a_failing_job_is_kept() -> None:
    calls = [0]

    def boom() -> None:
        calls[0] += 1
        raise RuntimeError("boom")

    scheduler = Scheduler([Job("boom", boom, 0.02)])
    scheduler.start()
    time.sleep(0.15)
    scheduler.shutdown()
    assert calls[0] >= 3


def test_shutdown_waits_for_the_running_job() -> None:
    finished = threading.Event()
    entered = threading.Event()

    def long() -> None:
        entered.set()
        time.sleep(0.2)
        finished.set()

    scheduler = Scheduler([Job("long", long, 0.01)])
    scheduler.start()
    assert entered.wait(2)
    scheduler.shutdown(wait=True)
    assert finished.is_set()


def test_skipped_runs_are_counted_exported_and_logged_at_most_once_per_period(caplog) -> None:
    now = [0.0]
    skips = Skips(log_seconds=300.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="agent.schedule"):
        for _ in range(100):  # a sample job overrunning by 2 ticks, every 10 s
            skips.add("sample", 2, 1.0)
            now[0] += 10.0
        skips.add("flush", 0, 10.0)  # nothing skipped: nothing counted or logged
    lines = [r.getMessage() for r in caplog.records]
    # 1000 s of overruns: a line at 0, 300, 600 and 900 s, each with the runs since the last
    assert len(lines) == 4, lines
    assert lines[0] == "job sample overran its 1s interval: 2 runs skipped (2 since start)"
    assert lines[1].endswith("60 runs skipped (62 since start)")
    assert skips.totals() == {"sample": 200}
    text = render(build_registry([SkipsCollector("n1", skips.totals)], process_metrics=False))
    assert b'aiscope_agent_skipped_runs_total{job="sample",node="n1"} 200.0' in text


def test_the_scheduler_reports_its_skips_to_the_shared_counter() -> None:
    skips = Skips()
    scheduler = Scheduler([Job("slow", lambda: time.sleep(0.1), 0.02)], skips=skips)
    scheduler.start()
    time.sleep(0.35)
    scheduler.shutdown()
    assert skips.totals()["slow"] >= 6
    assert scheduler.skipped == skips.totals()
