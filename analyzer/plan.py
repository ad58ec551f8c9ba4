"""``aiscope plan``: demand per class and per pool over the stored history, its trend and season,
forecasts with their backtested error, when each pool runs out, and what to buy.

Pools (:data:`POOLS`): ``inference`` (online inference), ``training`` (training and batch) and
``interactive``. A pool's capacity is the GPUs of its classes over the newest week (the
analysis' classifier); a GPU idle all week belongs to none and is spare capacity. Its demand
history counts each GPU-hour in the class the GPU had that week (the newest
:data:`CLASSIFIED_WEEKS` weeks are classified one by one; older hours take the oldest's).

Demand per hour, from the minute rollups (kept 400 days) and the raw samples where newer:

* inference, in GPU-equivalents, the reservation's measure: the GPUs' busy share (utilization)
  over the target utilization that leaves latency headroom (0.70);
* training and interactive, in GPUs held (a GPU with at least 1 GiB in use). The demand that
  waited in a scheduler's queue is not in an aiscope store: ``--queue FILE`` adds it
  (:mod:`analyzer.queue`), else the plan says it is missing.

Each pool's series is forecast with :mod:`analyzer.forecast` (the method its bench chose), and
only with the error its own rolling-origin backtest showed; too little history gives
``not_enough_data`` and no forecast. A week's forecast is the week's p99 of the hourly forecast
(p50 and the interval's bounds); a pool saturates in the first week whose p99 p50 exceeds its
capacity, and reserved inference is at risk of missing its latency target from the first week
whose upper bound does.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzer import configfile, declared
from analyzer import forecast as fc
from analyzer.analysis import iso, parse_duration
from analyzer.classify import GpuVerdict
from analyzer.context import context
from analyzer.context import to_json as finding_json
from analyzer.engine import Engine
from analyzer.findings import run as run_detectors
from analyzer.load import FleetData, History, InputError, history, inputs
from analyzer.queue import Pending, read_pending
from analyzer.recommendations.placement import scale_out_waiting
from analyzer.recommendations.reservation import ReservationSettings
from analyzer.stages import load_and_classify
from analyzer.thresholds import Thresholds
from analyzer.window import looks_like_time, parse_time
from store.storefile import Input

SCHEMA = "aiscope.plan/1"
HOUR = 3600.0
DAY = 86_400.0
WEEK = 7 * DAY
#: Pool -> the classes whose GPUs it holds and whose demand it serves.
POOLS: dict[str, tuple[str, ...]] = {
    "inference": ("inference",),
    "training": ("training", "batch"),
    "interactive": ("interactive",),
}
CLASSES = ("training", "inference", "batch", "interactive", "idle")
#: Pools whose demand a queue file may add to (in GPUs; inference is in GPU-equivalents).
QUEUED_POOLS = ("training", "interactive")
#: The interval reported with every forecast (and scored by every backtest).
LEVEL = 0.8
#: Weeks classified back from the newest (each GPU-hour counts in its week's class; older
#: hours take the oldest of these).
CLASSIFIED_WEEKS = 8
#: The longest horizon forecast.
MAX_HORIZON_WEEKS = 104
#: The quantile of a week's hourly demand that sizes a pool.
WEEK_QUANTILE = 0.99


@dataclass(frozen=True, slots=True)
class Site:
    """The ``[site]`` table: what a purchase is made of. ``None``: measured or not known."""

    rack_kw: float | None = None  # the power budget of a rack, kW
    nodes_per_rack: int = 4
    gpus_per_node: int | None = None  # default: the fleet's most common node size
    node_overhead_watts: float = 0.0  # CPUs, NICs, fans: the GPUs' draw is measured, this is not
    target_utilization: float = ReservationSettings().target_util


@dataclass(frozen=True, slots=True)
class PoolSeries:
    pool: str
    classes: tuple[str, ...]
    capacity_gpus: int
    unit: str  # gpu_equivalents | gpus_held
    demand: list[float | None] = field(default_factory=list)
    #: GPUs that waited in the scheduler's queue per hour (included in ``demand``); ``None``:
    #: no queue was given for this pool.
    pending: list[float | None] | None = None


def parse_horizon(text: str, flag: str = "--horizon") -> float:
    """A DURATION (``90s``, ``15m``, ``24h``, ``7d``, ``12w``) -> seconds, the error naming
    ``flag``; a horizon is at most :data:`MAX_HORIZON_WEEKS`. Raises :class:`InputError`."""
    seconds = parse_duration(text, flag)
    if flag == "--horizon" and seconds > MAX_HORIZON_WEEKS * WEEK:
        raise InputError(
            f"--horizon: at most {MAX_HORIZON_WEEKS}w (a trend extrapolated further is a "
            f"guess, not a plan), got {text!r}"
        )
    return seconds


def site_from_file(path: Path | None) -> Site:
    """The ``[site]`` table of a TOML config file (defaults when ``path`` is ``None``)."""
    if path is None:
        return Site()
    return site_from_mapping(configfile.table(path, "site"), f"{path}: site")


def site_from_mapping(table: Mapping[str, Any], where: str = "site") -> Site:
    known = (
        "rack_kw",
        "nodes_per_rack",
        "gpus_per_node",
        "node_overhead_watts",
        "target_utilization",
    )
    for key in table:
        if key not in known:
            raise InputError(f"{where}: unknown key {key!r} (known: {', '.join(known)})")
    values: dict[str, Any] = {}
    for key, value in table.items():
        integer = key in ("nodes_per_rack", "gpus_per_node")
        ok = isinstance(value, int) if integer else isinstance(value, int | float)
        if isinstance(value, bool) or not ok or not math.isfinite(value) or value < 0:
            kind = "a whole number" if integer else "a number"
            raise InputError(f"{where}.{key}: expected {kind} >= 0, got {value!r}")
        values[key] = value
    if values.get("nodes_per_rack", 1) < 1 or values.get("gpus_per_node", 1) < 1:
        raise InputError(f"{where}: nodes_per_rack and gpus_per_node must be at least 1")
    if not 0 < values.get("target_utilization", 0.7) <= 1:
        raise InputError(f"{where}.target_utilization: expected a ratio in (0, 1]")
    if values.get("rack_kw", 1.0) <= 0:
        raise InputError(f"{where}.rack_kw: expected a power budget above 0 kW")
    return Site(**values)


def plan(
    stores: list[str],
    horizon: str = "12w",
    since: str | None = None,
    timeout: float = 10.0,
    thresholds: Thresholds | None = None,
    site: Site | None = None,
    classes: Mapping[str, str] | None = None,
    queue: Path | None = None,
    findings: Sequence[Mapping[str, Any]] | None = None,
    until: str | None = None,
    engine: Engine | None = None,
) -> dict[str, Any]:
    """The ``aiscope.plan/1`` document of the stores (each week classified in stages on
    ``engine`` when given: :mod:`analyzer.stages`). ``classes`` (``uuid`` -> class over the
    newest week) saves classifying again when the caller has just analyzed that week; ``queue``
    is a CSV of GPUs waiting (:mod:`analyzer.queue`); ``findings`` (the analysis document's)
    give the fleet's waiting and its scale-out share, found here when classes are not given;
    ``since`` a DURATION or a TIME and ``until`` a TIME bound the history read
    (:mod:`analyzer.window`)."""
    horizon_seconds = parse_horizon(horizon)
    start_at = parse_time(since, "--since") if since and looks_like_time(since) else None
    since_seconds = parse_horizon(since, "--since") if since and start_at is None else None
    until_ts = parse_time(until, "--until") if until else None
    site = site or Site()
    pending = read_pending(queue, QUEUED_POOLS) if queue is not None else None
    paths = inputs(stores)
    hist = history(paths, since_seconds, timeout, until_ts, start_at)
    if classes is None:
        week = min(WEEK, hist.end - hist.start)
        data, observed = load_and_classify(engine, paths, week, timeout, until_ts, None, thresholds)
        # As the analysis classes them: behaviour, then declared intent (one truth).
        verdicts = declared.combine(data, observed)
        classes = {v.info.uuid: v.gpu_class for v in verdicts}
        if findings is None:
            findings = _findings(data, verdicts, thresholds)
    past = _past_classes(paths, hist, thresholds, timeout, engine)
    stores_read = [str(p) for p in paths]
    doc = build(hist, classes, horizon_seconds, site, stores_read, pending, past)
    if findings is not None:
        doc["waiting"] = scale_out_waiting(findings)
    return doc


def _findings(
    data: FleetData, verdicts: list[GpuVerdict], thresholds: Thresholds | None
) -> list[dict[str, Any]]:
    """The newest week's findings, as the analysis document has them."""
    ctx = context(data, verdicts, thresholds or Thresholds())
    return [finding_json(f, iso) for f in run_detectors(ctx).findings]


def _past_classes(
    paths: Sequence[Input],
    hist: History,
    thresholds: Thresholds | None,
    timeout: float,
    engine: Engine | None = None,
) -> list[dict[str, str]]:
    """Each GPU's class in the weeks before the newest (newest first, up to
    :data:`CLASSIFIED_WEEKS` in all), when the history is long enough for a forecast; a week
    without samples gets no classes."""
    if hist.end - hist.start < 2 * WEEK:
        return []
    weeks = min(CLASSIFIED_WEEKS, math.ceil((hist.end - hist.start) / WEEK))
    out: list[dict[str, str]] = []
    for k in range(1, weeks):
        try:
            until = hist.end - k * WEEK
            _, verdicts = load_and_classify(engine, paths, WEEK, timeout, until, None, thresholds)
        except InputError:
            out.append({})
            continue
        out.append({v.info.uuid: v.gpu_class for v in verdicts})
    return out


def build(
    hist: History,
    classes: Mapping[str, str],
    horizon_seconds: float,
    site: Site,
    stores: Sequence[str] = (),
    pending: Pending | None = None,
    past: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """The plan document from the history and each GPU's class (``uuid`` -> class) over the
    newest week (capacity, and the hours of that week) and in the weeks before it (``past``,
    newest first; hours older than them take the oldest)."""
    start = math.floor(hist.start / HOUR) * HOUR
    steps = max(1, math.ceil((hist.end - start) / HOUR))
    busy, held = _class_series(hist, [classes, *past], start, steps)
    series = _pool_series(classes, busy, held, site, steps)
    if pending is not None:
        series = [_with_pending(s, pending, start) for s in series]
    end = start + steps * HOUR
    pools = [_pool(s, end, horizon_seconds) for s in series]
    node = _node_shape(hist, site)
    week = [v for v in held["batch"][-int(WEEK / HOUR) :] if v is not None]
    spare = _spare(pools, classes, sum(week) / len(week) if week else 0.0)
    purchases = [b for s in pools for b in _purchases(s, node, site, spare)]
    return {
        "schema": SCHEMA,
        "history": {"start": iso(start), "end": iso(end)},
        "horizon": {"start": iso(end), "end": iso(end + horizon_seconds)},
        "stores": list(stores),
        "classes": _classes_json(busy, held, classes, hist, end),
        "pools": pools,
        "purchases": purchases,
        "node": node,
        "moves": spare["moves"],
        "notes": _notes(site, pending),
    }


# -- demand series ------------------------------------------------------------------------


def _class_series(
    hist: History, weekly: Sequence[Mapping[str, str]], start: float, steps: int
) -> tuple[dict[str, list[float | None]], dict[str, list[float | None]]]:
    """Per class and hour: GPUs busy (sum of busy shares) and GPUs held; ``None`` for an hour
    without any sample of that class's GPUs. ``weekly``: the classes by week back from the
    end, newest first (a GPU a week does not know takes its newest class)."""
    busy: dict[str, list[float | None]] = {c: [None] * steps for c in CLASSES}
    held: dict[str, list[float | None]] = {c: [None] * steps for c in CLASSES}
    end = start + steps * HOUR
    for h in hist.hours:
        i = int((h.start - start) // HOUR)
        if not 0 <= i < steps:
            continue
        week = weekly[min(int((end - h.start - HOUR) // WEEK), len(weekly) - 1)]
        c = week.get(h.uuid) or weekly[0].get(h.uuid, "idle")
        if h.util is not None:
            busy[c][i] = (busy[c][i] or 0.0) + h.util
        if h.held_ratio is not None:
            held[c][i] = (held[c][i] or 0.0) + h.held_ratio
    return busy, held


def _pool_series(
    classes: Mapping[str, str],
    busy: Mapping[str, list[float | None]],
    held: Mapping[str, list[float | None]],
    site: Site,
    steps: int,
) -> list[PoolSeries]:
    out = []
    counts: dict[str, int] = defaultdict(int)
    for c in classes.values():
        counts[c] += 1
    for pool, members in POOLS.items():
        capacity = sum(counts[c] for c in members)
        if capacity == 0:
            continue
        if pool == "inference":
            demand = [None if v is None else v / site.target_utilization for v in busy["inference"]]
            unit = "gpu_equivalents"
        else:
            demand = _sum([held[c] for c in members], steps)
            unit = "gpus_held"
        out.append(PoolSeries(pool, members, capacity, unit, demand))
    return out


def _with_pending(s: PoolSeries, pending: Pending, start: float) -> PoolSeries:
    """The pool's demand plus the GPUs that waited in its queue, hour by hour (hours the store
    has no demand for stay unknown)."""
    by_hour = pending.hours.get(s.pool)
    if not by_hour:
        return s
    waited = [by_hour.get(start + i * HOUR) for i in range(len(s.demand))]
    demand = [None if d is None else d + (w or 0.0) for d, w in zip(s.demand, waited, strict=True)]
    return dataclasses.replace(s, demand=demand, pending=waited)


def _sum(series: list[list[float | None]], steps: int) -> list[float | None]:
    out: list[float | None] = []
    for i in range(steps):
        values = [s[i] for s in series if s[i] is not None]
        out.append(sum(v for v in values if v is not None) if values else None)
    return out


# -- one pool -----------------------------------------------------------------------------


def _pool(s: PoolSeries, end: float, horizon_seconds: float) -> dict[str, Any]:
    """One pool's entry: its newest week's demand, and the forecast with its backtest, or
    ``not_enough_data`` with the reason."""
    last_week = [v for v in s.demand[-int(WEEK / HOUR) :] if v is not None]
    entry: dict[str, Any] = {
        "pool": s.pool,
        "classes": list(s.classes),
        "unit": s.unit,
        "capacity_gpus": s.capacity_gpus,
        "demand_p99_gpus": _r(fc.quantile(last_week, WEEK_QUANTILE)) if last_week else None,
        "demand_mean_gpus": _r(sum(last_week) / len(last_week)) if last_week else None,
        "growth_per_week": None,
        "season": None,
        "saturation": None,
        "forecast": [],
        "backtest": None,
        "not_enough_data": None,
        "history_daily": _daily(s.demand, end),
    }
    if s.pool == "inference":
        entry["slo_risk"] = None
    if s.pending is not None:
        waited = [v for v in s.pending[-int(WEEK / HOUR) :] if v is not None]
        entry["pending_p99_gpus"] = _r(fc.quantile(waited, WEEK_QUANTILE)) if waited else None
        entry["pending_mean_gpus"] = _r(sum(waited) / len(waited)) if waited else None
    reason = _forecast(entry, s, end, horizon_seconds)
    entry["not_enough_data"] = reason
    return entry


def _forecast(
    entry: dict[str, Any], s: PoolSeries, end: float, horizon_seconds: float
) -> str | None:
    """Fill the entry's forecast fields; the reason there is no forecast, else ``None``."""
    known = sum(1 for v in s.demand if v is not None)
    days = len(s.demand) * HOUR / DAY
    if days < 14 or known < 14 * 24 * 0.5:
        return (
            f"{days:.1f} days of history ({known} hours with data); a weekly forecast "
            "needs at least 14 days, half of them with data"
        )
    bt = fc.backtest(s.demand, HOUR, level=LEVEL)
    model = fc.fit(s.demand, HOUR)
    if isinstance(bt, fc.NotEnoughData):
        return bt.reason
    if isinstance(model, fc.NotEnoughData):
        return model.reason
    weeks = _weeks(model.forecast(max(1, round(horizon_seconds / HOUR)), LEVEL), end)
    entry["growth_per_week"] = _r(model.growth_per_week, 4)
    entry["season"] = _season(s.demand, model.season_steps)
    entry["forecast"] = weeks
    entry["backtest"] = {
        "method": bt.method,
        "mase": _r(bt.mase),
        "coverage": _r(bt.coverage),
        "level": bt.level,
        "origins": bt.origins,
        "horizon_hours": bt.horizon_steps,
    }
    entry["saturation"] = _first(weeks, "p50", s.capacity_gpus)
    if s.pool == "inference":
        entry["slo_risk"] = _first(weeks, "high", s.capacity_gpus)
    return None


def _weeks(f: fc.Forecast, end: float) -> list[dict[str, Any]]:
    """The forecast's weeks (from the end of the history): each the p99 of its hours."""
    per = int(WEEK / HOUR)
    out = []
    for k in range(0, len(f.p50), per):
        chunk = slice(k, k + per)
        out.append(
            {
                "week": iso(end + k * HOUR),
                "p50": _r(fc.quantile(f.p50[chunk], WEEK_QUANTILE)),
                "low": _r(fc.quantile(f.low[chunk], WEEK_QUANTILE)),
                "high": _r(fc.quantile(f.high[chunk], WEEK_QUANTILE)),
                "mean": _r(sum(f.p50[chunk]) / len(f.p50[chunk])),
            }
        )
    return out


def _first(weeks: list[dict[str, Any]], key: str, capacity: int) -> str | None:
    return next((w["week"] for w in weeks if w[key] is not None and w[key] > capacity), None)


def _season(demand: list[float | None], m: int) -> dict[str, Any]:
    """The season's shape: peak and trough of the mean profile over the mean, and the peak's
    hour (UTC, of the day or of the week)."""
    values = fc.fill_gaps(demand, m) or [0.0]
    profile = [sum(values[p::m]) / len(values[p::m]) for p in range(m)]
    mean = sum(profile) / m
    peak = max(range(m), key=lambda p: profile[p])
    return {
        "period_hours": m,
        "peak_to_mean": _r(profile[peak] / mean) if mean > 0 else None,
        "trough_to_mean": _r(min(profile) / mean) if mean > 0 else None,
        "peak_offset_hours": peak,
    }


def _daily(demand: list[float | None], end: float) -> list[dict[str, Any]]:
    """Per day of the history (aligned to its end): the p99 and the mean of the hours."""
    per = int(DAY / HOUR)
    n = len(demand)
    out = []
    for k in range(n % per, n, per) if n >= per else [0]:
        hours = [v for v in demand[k : k + per] if v is not None]
        if hours:
            day = end - (n - k) * HOUR
            out.append(
                {
                    "day": iso(day),
                    "p99": _r(fc.quantile(hours, WEEK_QUANTILE)),
                    "mean": _r(sum(hours) / len(hours)),
                }
            )
    return out


# -- what to buy --------------------------------------------------------------------------


def _node_shape(hist: History, site: Site) -> dict[str, Any]:
    """The node a purchase is made of: GPUs per node (the fleet's most common, unless set) and
    its draw at the p95 of the fleet's own measured history, scaled to that size."""
    physical: dict[str, set[str]] = defaultdict(set)  # a node's MIG slices are one GPU's
    for g in hist.gpus:
        physical[g.node].add(g.parent_uuid or g.uuid)
    sizes = sorted(len(uuids) for uuids in physical.values())
    common = max(set(sizes), key=lambda k: (sizes.count(k), k)) if sizes else 8
    gpus = site.gpus_per_node or common
    measured = hist.node_power_p95_watts
    per_gpu = measured / common if measured is not None and common else None
    watts = None if per_gpu is None else per_gpu * gpus + site.node_overhead_watts
    return {
        "gpus": gpus,
        "models": sorted({g.model for g in hist.gpus if g.model}),
        "gpu_power_p95_watts": _r(per_gpu, 1),
        "kw": _r(watts / 1000, 2) if watts is not None else None,
        "overhead_watts": site.node_overhead_watts,
    }


def _spare(
    pools: list[dict[str, Any]], classes: Mapping[str, str], batch_held: float
) -> dict[str, Any]:
    """GPUs that could move to a saturating pool before anything is bought: GPUs idle all of
    the newest week, another pool's capacity above its forecast upper bound (at the end of the
    horizon, or above its newest week's p99 when it has no forecast), and batch GPUs whose work
    fits in the inference pool's troughs (``batch_held``: batch GPUs held, mean of the week)."""
    idle = sum(1 for c in classes.values() if c == "idle")
    spare_by_pool: dict[str, int] = {}
    for p in pools:
        top = max((w["high"] for w in p["forecast"]), default=None)
        top = p["demand_p99_gpus"] if top is None else top
        if top is not None and p["saturation"] is None:
            spare_by_pool[p["pool"]] = max(0, math.floor(p["capacity_gpus"] - top))
    moves = []
    for p in pools:
        if p["saturation"] is None:
            continue
        if idle:
            moves.append(_move("idle", p["pool"], idle, "idle all of the newest week"))
            idle = 0
        for other, gpus in spare_by_pool.items():
            if gpus > 0:
                why = f"{other}'s capacity above its forecast p99 upper bound"
                moves.append(_move(other, p["pool"], gpus, why))
                spare_by_pool[other] = 0
    lent = sum(m["gpus"] for m in moves if m["from"] == "inference")
    batch = _batch_on_idle(pools, classes, batch_held, lent)
    return {"moves": [*moves, batch] if batch else moves}


def _batch_on_idle(
    pools: list[dict[str, Any]], classes: Mapping[str, str], batch_held: float, lent: int
) -> dict[str, Any] | None:
    """When training saturates and inference does not: the batch GPUs whose GPU-hours fit in
    the inference pool's mean spare capacity (its GPUs, less the ``lent`` ones, over its demand
    in GPU-equivalents at the target utilization), run there off-peak, free their GPUs for
    training."""
    by = {p["pool"]: p for p in pools}
    training, inference = by.get("training"), by.get("inference")
    batch_gpus = sum(1 for c in classes.values() if c == "batch")
    if not (training and inference and batch_gpus and batch_held > 0):
        return None
    if training["saturation"] is None or inference["saturation"] is not None:
        return None
    means = [w["mean"] for w in inference["forecast"]] or [inference["demand_mean_gpus"]]
    if any(m is None for m in means):
        return None
    trough = inference["capacity_gpus"] - lent - max(means)  # the worst week's mean spare
    gpus = min(batch_gpus, math.floor(trough * batch_gpus / batch_held)) if trough > 0 else 0
    if gpus <= 0:
        return None
    why = (
        f"batch work ({batch_held:.1f} GPUs held on average) run in the inference pool's "
        f"troughs ({trough:.1f} GPUs spare on average)"
    )
    return _move("batch", "training", gpus, why)


def _move(source: str, to: str, gpus: int, why: str) -> dict[str, Any]:
    return {"from": source, "to": to, "gpus": gpus, "why": why}


def _purchases(
    pool: dict[str, Any], node: dict[str, Any], site: Site, spare: dict[str, Any]
) -> list[dict[str, Any]]:
    """Whole nodes, staged by date: each the first forecast week whose p99 (p50) passes the
    pool's capacity with the GPUs moved into it and the nodes bought before; none when the pool
    does not saturate or the moves cover it to the horizon's end."""
    if pool["saturation"] is None:
        return []
    moved = sum(m["gpus"] for m in spare["moves"] if m["to"] == pool["pool"])
    per = int(node["gpus"])
    capacity = pool["capacity_gpus"]
    have = capacity + moved
    out = []
    for week in pool["forecast"]:
        short = week["p50"] - have
        if short <= 0:
            continue
        nodes = math.ceil(short / per)
        have += nodes * per
        needed = math.ceil(week["p50"] - capacity)
        out.append(
            {
                "by": week["week"],
                "pool": pool["pool"],
                "gpus": nodes * per,
                "nodes": nodes,
                "kw": None if node["kw"] is None else _r(nodes * node["kw"], 2),
                "racks": _racks(nodes, node["kw"], site),
                "gpus_needed": needed,  # over today's capacity, by this date
                "gpus_moved_first": min(moved, needed),
                "gpus_needed_at_high": max(0, math.ceil(week["high"] - capacity)),
            }
        )
    return out


def _racks(nodes: int, node_kw: float | None, site: Site) -> int:
    per_rack = site.nodes_per_rack
    if site.rack_kw is not None and node_kw:
        per_rack = max(1, min(per_rack, math.floor(site.rack_kw / node_kw)))
    return math.ceil(nodes / per_rack)


# -- demand per class ---------------------------------------------------------------------


def _classes_json(
    busy: Mapping[str, list[float | None]],
    held: Mapping[str, list[float | None]],
    classes: Mapping[str, str],
    hist: History,
    end: float,
) -> list[dict[str, Any]]:
    """Per class: GPUs, mean busy and held GPUs over the newest week, their growth per week
    over the whole history, useful work per kW (busy GPUs per kW drawn), and the daily history
    of GPUs busy and held."""
    power = _power_by_class(hist, classes, end)
    out = []
    week = int(WEEK / HOUR)
    for c in CLASSES:
        gpus = sum(1 for v in classes.values() if v == c)
        b = [v for v in busy[c][-week:] if v is not None]
        h = [v for v in held[c][-week:] if v is not None]
        if not gpus and all(v is None for v in held[c]):
            continue  # never seen in the history
        kw = power.get(c)
        mean_busy = sum(b) / len(b) if b else None
        out.append(
            {
                "class": c,
                "gpus": gpus,
                "busy_gpus": _r(mean_busy),
                "held_gpus": _r(sum(h) / len(h)) if h else None,
                "growth_per_week": _r(fc.growth_per_week(busy[c], HOUR), 4),
                "power_kw": _r(kw, 2),
                "busy_gpus_per_kw": _r(mean_busy / kw) if mean_busy is not None and kw else None,
                # The whole history, per day: GPUs busy (sum of busy shares) and GPUs held.
                "history_daily": {"busy": _daily(busy[c], end), "held": _daily(held[c], end)},
            }
        )
    return out


def _power_by_class(hist: History, classes: Mapping[str, str], end: float) -> dict[str, float]:
    """Mean GPU draw (kW) per class over the newest week."""
    hours: dict[str, set[float]] = defaultdict(set)
    watts: dict[str, float] = defaultdict(float)
    for h in hist.hours:
        if h.start >= end - WEEK and h.power_watts is not None:
            c = classes.get(h.uuid, "idle")
            watts[c] += h.power_watts
            hours[c].add(h.start)
    return {c: watts[c] / len(hours[c]) / 1000 for c in watts if hours[c]}


def _notes(site: Site, pending: Pending | None) -> list[str]:
    if pending is None:
        queue = (
            "Training demand is GPUs held: the demand that waited in a scheduler's queue is not "
            "in an aiscope store (give it with --queue FILE)."
        )
    else:
        pools = " and ".join(sorted(pending.hours))
        queue = f"The {pools} demand includes the GPUs that waited, from {pending.source}"
        queue += f" ({pending.skipped_rows} rows skipped)." if pending.skipped_rows else "."
    notes = [
        queue,
        f"Each GPU-hour counts in the class its GPU had that week (the newest {CLASSIFIED_WEEKS} "
        "weeks classified, older hours in the oldest's); capacity is each pool's GPUs today.",
    ]
    if site.node_overhead_watts == 0:
        notes.append(
            "Node power is the GPUs' measured draw only; set [site] node_overhead_watts for the "
            "CPUs, NICs and fans."
        )
    return notes


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)
