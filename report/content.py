"""The report's words and tables, shared by the Markdown, HTML and terminal forms."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from store.errors import BadInput
from store.schema import GpuClass

CLASS_ORDER: tuple[str, ...] = tuple(c.value for c in GpuClass)  # the contract's classes
_UID = re.compile(r"\b([0-9a-f]{8})-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_FLAT_NEED = re.compile(r"\bneeds (\d+)-\1\b")
_SPLIT_POOLS = re.compile(r"into \d+ reserved for inference, \d+ for training and \d+ flexible")
NO_INFERENCE_POOL = "no inference pool is needed"


def has_data(doc: dict[str, Any]) -> bool:
    """Whether the window holds any GPU-hours (a store sampled once, or not in the window,
    holds none: the report then says so instead of printing 0 GPU-hours as 100% of anything)."""
    return bool(sum(doc["summary"]["gpu_hours"].values()) > 0)


def fleet_size(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    return (
        f"{s['gpus']} GPU{'s' if s['gpus'] != 1 else ''} on {s['nodes']} "
        f"node{'s' if s['nodes'] != 1 else ''}"
    )


def headline(doc: dict[str, Any]) -> list[str]:
    s = doc["summary"]
    if not has_data(doc):
        return [
            f"No data in the window ({window(doc)}): {fleet_size(doc)} seen, "
            "but no GPU-hours to account for. Widen --since or check that the agents are running."
        ]
    total = sum(s["gpu_hours"].values())
    by_class = ", ".join(
        f"{c} {s['gpu_hours'][c]:,.0f}" for c in CLASS_ORDER if s["gpu_hours"].get(c)
    )
    sh = {k: share(v) for k, v in s["shares"].items()}
    lines = [
        f"{fleet_size(doc)} over {s['hours'] / 24:.1f} days: {total:,.0f} GPU-hours ({by_class}).",
        f"Useful {sh['useful']}, idle {sh['idle']}, starved {sh['starved']}, "
        f"idle-held {sh['idle_held']}, lost to noisy neighbours {sh['noisy_neighbor']}.",
    ]
    cost = bill_line(doc)
    return [*lines, cost] if cost else lines


def share(ratio: float) -> str:
    """A share of GPU-hours as a percentage; one decimal under 1% so that a share with findings
    behind it never reads "0%" (issue 24: "lost to noisy neighbours 0%" beside 29 GPU-hours)."""
    return f"{ratio:.1%}" if 0 < ratio < 0.01 else f"{ratio:.0%}"


def top_actions(doc: dict[str, Any]) -> list[str]:
    return [
        f"{a['action']}: {a['gpu_hours']:,.0f} GPU-hours on {a['gpus']} GPU"
        + ("s" if a["gpus"] != 1 else "")
        + (f" ({money(a['cost'], doc)})" if a.get("cost") is not None else "")
        for a in doc["summary"]["top_actions"]
    ]


#: The key a human view's copy of the document carries its display zone under (``--tz``);
#: :func:`in_zone` sets it, and the JSON written never has it (it stays UTC, as the contract).
DISPLAY_TZ = "display_tz"


def check_zone(name: str) -> dt.tzinfo:
    """An IANA zone name (``Europe/Berlin``, ``UTC``) -> its zone; :class:`BadInput` if none."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # noqa: PLC0415

    try:
        return dt.UTC if name.strip().upper() == "UTC" else ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise BadInput(
            f"--tz: unknown time zone {name!r} (an IANA name like Europe/Berlin, or UTC)"
        ) from None


def in_zone(doc: dict[str, Any], name: str | None) -> dict[str, Any]:
    """A copy of ``doc`` for the human views, with times shown in zone ``name`` (``None`` or
    UTC: ``doc`` itself, times as the JSON writes them)."""
    if name is None or name.strip().upper() == "UTC":
        return doc
    check_zone(name)
    return {**doc, DISPLAY_TZ: name.strip()}


def zone(doc: dict[str, Any]) -> dt.tzinfo | None:
    """The zone a human view shows times in; ``None``: UTC, as the JSON writes them."""
    name = doc.get(DISPLAY_TZ)
    return check_zone(name) if name else None


def shown(iso: str, doc: dict[str, Any]) -> str:
    """An ISO 8601 UTC time of the document as the human views show it: unchanged in UTC,
    else ``2026-11-16 01:00 CET`` in the ``--tz`` zone."""
    tz = zone(doc)
    if tz is None:
        return iso
    when = dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(tz)
    return when.strftime("%Y-%m-%d %H:%M %Z")


def zone_name(doc: dict[str, Any]) -> str:
    """``UTC``, or the ``--tz`` zone's name."""
    return str(doc.get(DISPLAY_TZ) or "UTC")


def window(doc: dict[str, Any]) -> str:
    return f"{shown(doc['window']['start'], doc)} to {shown(doc['window']['end'], doc)}"


def finding_rows(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["kind"] == kind]


def waiting_causes(f: dict[str, Any]) -> dict[str, float]:
    """A starved finding's GPU-hours by cause: its ``causes`` split where the analysis gave one
    (a job waits in collectives and for reasons unmeasured), else all under its ``cause``. The
    one split every view sums (report, ``aiscope job``, notify; issue 24: the report put the
    whole loss under the dominant cause while ``job`` split it)."""
    split = f.get("causes")
    if isinstance(split, dict) and split:
        return {str(c): float(h) for c, h in split.items()}
    return {str(f["cause"]): float(f["gpu_hours_lost"])}


def starved_by_cause(doc: dict[str, Any]) -> list[tuple[str, float, int]]:
    """(cause, GPU-hours lost, GPUs that waited for it), the largest first."""
    causes: dict[str, list[float]] = {}
    for f in finding_rows(doc, "starved"):
        for cause, hours in waiting_causes(f).items():
            if hours > 0:
                causes.setdefault(cause, []).append(hours)
    return sorted(((c, sum(v), len(v)) for c, v in causes.items()), key=lambda x: (-x[1], x[0]))


@dataclass(frozen=True)
class Timeline:
    """The fleet timeline from its first bucket with data to its last (an hour the window only
    grazes, with no bucket in it, is not drawn as a fleet of zero GPUs)."""

    start: dt.datetime
    step_seconds: int
    classes: dict[str, list[float]]

    @property
    def n(self) -> int:
        return max((len(v) for v in self.classes.values()), default=0)

    def at(self, index: float) -> dt.datetime:
        return self.start + dt.timedelta(seconds=index * self.step_seconds)


def timeline(doc: dict[str, Any]) -> Timeline:
    t = doc["summary"]["timeline"]
    start = dt.datetime.strptime(t["start"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    start = start.astimezone(zone(doc) or dt.UTC)  # labels and captions in the --tz zone
    classes = {c: list(v) for c, v in t["classes"].items()}
    n = max((len(v) for v in classes.values()), default=0)
    totals = [sum(v[i] for v in classes.values() if i < len(v)) for i in range(n)]
    filled = [i for i, total in enumerate(totals) if total]
    lo, hi = (filled[0], filled[-1] + 1) if filled else (0, 0)
    step = int(t["step_seconds"])
    return Timeline(
        start + dt.timedelta(seconds=lo * step), step, {c: v[lo:hi] for c, v in classes.items()}
    )


def timeline_labels(t: Timeline) -> list[tuple[float, str]]:
    """(index, text) ticks on boundaries in UTC: midnights named by the day they start, for
    spans over two days (every day, or every few for long windows), else whole hours."""
    if t.n < 2:
        return []
    span = (t.n - 1) * t.step_seconds
    days = span > 2 * 86400
    every = math.ceil(span / 86400 / 8) * 86400 if days else _hour_step(span)
    # Boundaries of the zone the timeline is shown in (its offset at the start): midnights and
    # whole hours there, not in UTC.
    offset = (t.start.utcoffset() or dt.timedelta()).total_seconds()
    first = math.ceil((t.start.timestamp() + offset) / every) * every - offset
    out = []
    for ts in range(int(first), int(t.start.timestamp() + span) + 1, int(every)):
        when = dt.datetime.fromtimestamp(ts, t.start.tzinfo or dt.UTC)
        index = (ts - t.start.timestamp()) / t.step_seconds
        out.append((index, when.strftime("%a %d") if days else when.strftime("%H:%M")))
    return out


def _hour_step(span: float) -> int:
    return next(k for k in (1, 2, 3, 6, 12, 24) if span / (k * 3600) <= 8) * 3600


def coverage_lines(doc: dict[str, Any]) -> list[str]:
    c = doc["summary"]["coverage"]
    missing = ", ".join(f"{k} {v:.0%}" for k, v in c["missing_fields"].items() if v > 0)
    events = ", ".join(f"{k} {v}" for k, v in c["events"].items())
    return [
        f"{c['samples']:,} GPU samples; {c['intervals_missing']:,} of "
        f"{c['intervals_expected']:,} GPU-intervals have no sample (gaps).",
        f"Samples with the GPU not answering: {c['samples_gpu_down']:,}.",
        f"Fields not reported: {missing or 'none'}.",
        f"Agent events: {events or 'none'}.",
        *c.get("window_notes", ()),  # stores the window left out, a window longer than the data
    ]


def service_name(r: dict[str, Any]) -> str:
    """Who a reservation is for: the service's or pod's name where the document carries one
    (``service``, ``name``), else its pool, with a bare pod UID cut to its first 8 digits."""
    for key in ("service", "name"):
        if r.get(key):
            return str(r[key])
    pool = str(r.get("pool", ""))
    hint = _command_hint(r) if _UID.search(pool) else ""
    return (f"{hint} on " if hint else "") + short_uids(pool)


def _command_hint(r: dict[str, Any]) -> str:
    """What a pod known only by its UID serves: its ``--model``, else its program's name."""
    command = next((e[9:] for e in r.get("evidence", ()) if e.startswith("command: ")), "")
    words = command.split()
    if "--model" in words[:-1]:
        return words[words.index("--model") + 1]
    return words[0].rsplit("/", 1)[-1] if words and command != "not seen" else ""


def short_uids(text: str) -> str:
    return _UID.sub(r"\1…", text)


def rec_text(r: dict[str, Any], text: str) -> str:
    """A recommendation's sentence as the report prints it: the service by name, a need whose
    ends are equal as one number, no pool of 0 GPUs named in a split."""
    if r.get("pool"):
        text = text.replace(str(r["pool"]), service_name(r))
    text = _FLAT_NEED.sub(r"needs \1", short_uids(text))
    if r["kind"] == "split":
        text = _split_text(r["pools"], text)
    return text


def _split_text(pools: dict[str, int], text: str) -> str:
    words = {"inference-reserved": "{} reserved for inference", "training": "{} for training"}
    parts = [words.get(k, "{} " + k).format(v) for k, v in pools.items() if v > 0]
    phrase = (
        ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1] if parts else ""
    )
    text = _SPLIT_POOLS.sub(lambda _: f"into {phrase}", text)
    if not pools.get("inference-reserved"):
        text = f"{text.rstrip()} No inference pool is needed: inference runs on the flexible pool."
    return text


def pools_text(pools: dict[str, int]) -> str:
    """The split's pools that hold GPUs (a pool of 0 is not a reservation)."""
    shown = ", ".join(f"{k} {v}" for k, v in pools.items() if v > 0) or "none"
    return shown + ("" if pools.get("inference-reserved") else f" ({NO_INFERENCE_POOL})")


def span(lo: float, hi: float) -> str:
    """``lo to hi``, or one number when they are equal."""
    return f"{lo:g}" if lo == hi else f"{lo:g} to {hi:g}"


def gpu_label(entry: dict[str, Any], doc: dict[str, Any] | None = None) -> str:
    """``node/gpu`` of a GPU or a finding; a MIG instance is ``node/1 / 3g.40gb`` (its parent's
    index and its profile, and the GPU-instance id when known). A finding is looked up in the
    document's ``gpus[]`` by uuid."""
    mig = entry.get("mig")
    if mig is None and doc is not None:
        mig = next(
            (g.get("mig") for g in doc.get("gpus", []) if g.get("uuid") == entry.get("uuid")),
            None,
        )
    name = f"{entry['node']}/{entry['gpu']}"
    if not mig:
        return name
    gi = mig.get("gpu_instance_id")
    return f"{name} / {mig.get('profile') or 'MIG'}" + (f" (GI {gi})" if gi is not None else "")


def gpu_why(g: dict[str, Any]) -> str:
    """Why a GPU has its class: its share of the window, then the class's own first piece of
    evidence (the verdict's list starts "<class> for N% of the window"; an "idle for N%" line,
    before or after the class's evidence, is about another class and is skipped)."""
    first, *rest = g["evidence"]
    about = [e for e in rest if g["class"] == "idle" or not e.startswith("idle for ")]
    return "; ".join([first, *about[:1]])


def recommendation_fields(r: dict[str, Any]) -> list[str]:
    """The structured fields worth a line under the sentence."""
    out = []
    effect = r.get("effect", {})
    if r["kind"] == "reservation":
        rp = r["replay"]["recommended"]
        peak = r["replay"].get("peak")
        growth = (r.get("growth") or {}).get("used_per_week_ratio")
        out.append(
            f"pool {service_name(r)}: {r['gpus']} GPUs at p{round(r['quantile'] * 100)}; replay: "
            f"{rp['under_ratio']:.1%} of intervals under"
            + (f" (reserving the peak: {peak['under_ratio']:.1%})" if peak else "")
            + f", {rp['idle_gpu_hours']:,.0f} GPU-h idle"
            + (f"; growth used {growth:+.0%} a week" if growth is not None else "")
        )
    if r["kind"] == "split":
        out.append("pools: " + pools_text(r["pools"]))
        out += [f"policy: {p}" for p in r["policy"]]
    if r["kind"] == "consolidate" and r.get("mig_profiles"):
        out.append("MIG: " + ", ".join(f"{k} -> {v}" for k, v in r["mig_profiles"].items()))
    out.append(
        f"effect: {effect.get('gpus_freed', 0)} GPUs freed, {effect.get('gpus_needed', 0)} "
        f"needed; risk: {effect.get('risk', 'n/a')}; confidence {r['confidence']:.0%}"
    )
    return out


def rest_where(
    attached: Mapping[str, str] | None, table: str, default: str = "see the JSON"
) -> str:
    """Where the rows a table leaves out are: the attached file that holds all of ``table``
    (a mail's ``findings.csv``), else ``default`` (a report written beside its JSON)."""
    if attached and table in attached:
        return f"all of them in the attached {attached[table]}"
    return default


def finding_summary(f: dict[str, Any]) -> str:
    """A finding in a few words (the text form and the report's tables)."""
    if f["kind"] == "starved":
        return f"{f['cause']} ({f['job']}, waiting {f['waiting_ratio']:.0%})"
    if f["kind"] == "noisy_neighbor":
        slowed = (
            "contended"  # a null slowdown: the victim's own baseline could not be measured
            if f.get("slowdown_ratio") is None
            else f"slowed {f['slowdown_ratio']:.0%}"
        )
        return f"{f['victim']} {slowed} by {f['aggressor']} ({f['resource']})"
    if f["kind"] == "declared_mismatch":
        what = f"{f['declared_kind']} {f.get('declared_name') or f['workload']}"
        ratio = f.get("computed_ratio")
        computed = f", computed in {ratio:.0%} of intervals" if ratio is not None else ""
        return (
            f"{what}, declared {f['declared_class']}, runs as {f['observed_class']}"
            f" on {f['gpus']} GPU{'s' if f['gpus'] != 1 else ''}{computed}"
        )
    if f["kind"] == "node_silent":
        return f"{len(f['gpus'])} GPUs silent since {f['last_sample']}"
    return f"held by {f['holder']} for {f['idle_held_seconds'] / 3600:.1f} h"


# -- declared intent ---------------------------------------------------------------------------


def declared_label(d: dict[str, Any]) -> str:
    """``Deployment chat/x (kubernetes)`` for a GPU's ``declared`` object."""
    what = f"{d['kind']} {d['name']}" if d.get("name") else d["kind"]
    return f"{what} ({d['source']})"


def declared_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per workload that declares something: its declaration, the class it implies,
    the classes its GPUs were observed in, and how the two met (``agrees``, ``mismatch``: the
    behaviour stood on strong evidence, ``as declared``: the behaviour was too unsure to stand,
    or ``-`` when the declaration implies no class). Mismatches first, then by GPUs."""
    rows: dict[str, dict[str, Any]] = {}
    for g in doc["gpus"]:
        d = g.get("declared")
        if not d:
            continue
        key = d.get("workload") or declared_label(d)
        row = rows.setdefault(
            key,
            {
                "workload": key,
                "declared": declared_label(d),
                "implies": d.get("implies"),
                "observed": {},
                "gpus": 0,
                "unsure": False,
            },
        )
        row["observed"][g["class"]] = row["observed"].get(g["class"], 0) + 1
        row["gpus"] += 1
        row["unsure"] |= any("too weak to stand" in e for e in g.get("evidence", ()))
    out = []
    for row in rows.values():
        implies, observed = row["implies"], row["observed"]
        if implies is None:
            status = "-"
        elif any(c not in (implies, "idle") for c in observed):
            status = "mismatch"
        else:
            status = "as declared" if row["unsure"] else "agrees"
        classes = ", ".join(f"{c} ({n})" for c, n in sorted(observed.items()))
        out.append({**row, "observed": classes, "status": status})
    return sorted(out, key=lambda r: (r["status"] != "mismatch", -r["gpus"], r["workload"]))


# -- owners and money --------------------------------------------------------------------------

_SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥"}
_SPECIAL_OWNERS = ("(unowned)", "(unattributed)")


def priced(doc: dict[str, Any]) -> bool:
    """Whether the document carries money (``[prices]`` was configured)."""
    bill = doc.get("bill") or {}
    return bill.get("cost") is not None


def money(value: float | None, doc: dict[str, Any]) -> str:
    """An amount in the bill's currency: ``$1,234`` (cents under 100), ``1,234 CHF``."""
    if value is None:
        return ""
    currency = (doc.get("bill") or {}).get("currency") or ""
    number = f"{value:,.0f}" if abs(value) >= 100 or value == 0 else f"{value:,.2f}"
    symbol = _SYMBOLS.get(currency)
    return f"{symbol}{number}" if symbol else f"{number} {currency}".strip()


def bill_line(doc: dict[str, Any]) -> str | None:
    """The headline's money sentence, when prices are set."""
    if not priced(doc):
        return None
    b = doc["bill"]
    w = b["waste_cost"]
    energy = (
        ""
        if b["energy_cost"] is None
        else f" and energy {money(b['energy_cost'], doc)} ({b['energy_kwh']:,.0f} kWh)"
    )
    return (
        f"Cost {money(b['cost'], doc)}: GPU-hours {money(b['gpu_cost'], doc)}{energy}; "
        f"of it idle and unowned {money(w['idle_unowned'], doc)}, idle-held "
        f"{money(w['idle_held'], doc)}, starved {money(w['starved'], doc)}"
        + (
            f", noisy neighbours {money(w['noisy_neighbor'], doc)}"
            if w.get("noisy_neighbor") is not None
            else ""
        )
        + "."
    )


def _owner_classes(o: dict[str, Any]) -> str:
    return ", ".join(
        f"{c} {o['gpu_hours'][c]:,.0f}" for c in CLASS_ORDER if o["gpu_hours"].get(c, 0) >= 0.5
    )


def owner_table(doc: dict[str, Any], n: int) -> tuple[list[str], list[list[str]]]:
    """Owners by cost (by GPU-hours when unpriced), the top ``n`` and the rest summed, the
    idle and unattributed lines, and the total: the rows add up to the fleet's bill."""
    owners = doc.get("owners") or []
    money_on = priced(doc)
    header = ["owner", "kind", "GPU-h", "by class", "idle GPU-h", "idle-held GPU-h"]
    header += ["starved GPU-h"]
    header += ["cost", "waste"] if money_on else []

    def row(name: str, kind: str, entries: list[dict[str, Any]]) -> list[str]:
        total = sum(e["gpu_hours_total"] for e in entries)
        cells = [
            name,
            kind,
            f"{total:,.1f}",
            _owner_classes(entries[0]) if len(entries) == 1 else "",
            f"{sum(e['idle_gpu_hours'] for e in entries):,.1f}",
            f"{sum(e['idle_held_gpu_hours'] for e in entries):,.1f}",
            f"{sum(e['starved_gpu_hours'] for e in entries):,.1f}",
        ]
        if money_on:
            cells += [
                money(sum(e["cost"] for e in entries), doc),
                money(sum(e["waste_cost"] for e in entries), doc),
            ]
        return cells

    named = [o for o in owners if o["owner"] not in _SPECIAL_OWNERS]
    rows = [row(o["owner"], o["kind"], [o]) for o in named[:n]]
    if len(named) > n:
        rows.append(row(f"{len(named) - n} more owners", "", named[n:]))
    rows += [
        row(o["owner"], o.get("special") or o["kind"], [o])
        for o in owners
        if o["owner"] in _SPECIAL_OWNERS
    ]
    if owners:
        rows.append(row("total", "", owners))
    return header, rows


def waste_lines(doc: dict[str, Any], n: int) -> list[str]:
    """The owners who wasted most (idle-held plus starved), each with what to look at."""
    owners = [
        o
        for o in doc.get("owners") or []
        if o["idle_held_gpu_hours"] + o["starved_gpu_hours"] >= 0.05
    ]
    owners.sort(
        key=lambda o: (
            -(o["waste_cost"] or 0.0),
            -(o["idle_held_gpu_hours"] + o["starved_gpu_hours"]),
            o["owner"],
        )
    )
    out = []
    for o in owners[:n]:
        cost = f" ({money(o['waste_cost'], doc)})" if priced(doc) else ""
        out.append(
            f"{o['owner']} ({o['kind']}): {o['idle_held_gpu_hours']:,.1f} GPU-h idle-held, "
            f"{o['starved_gpu_hours']:,.1f} GPU-h starved{cost}"
        )
    return out


def owner_notes(doc: dict[str, Any]) -> list[str]:
    """How the owners were counted, in a sentence or two."""
    if not doc.get("owners"):
        return []
    notes = [
        "Every GPU-hour is counted once: to the team that names its user, namespace or "
        "account, else to its namespace, account or user; shared GPUs are split by each "
        "workload's measured share (its own SM utilization, else the memory it holds). "
        "(unowned) is idle capacity no workload held; (unattributed) is use with no process seen."
    ]
    shared = [
        f"{o['owner']}: {e}"
        for o in doc["owners"]
        for e in o.get("evidence", ())
        if e.startswith("shared GPUs split")
    ]
    notes += shared[:3]
    return notes
