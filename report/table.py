"""``aiscope analyze --format text``: the analysis document as a plain table, one line per GPU."""

from __future__ import annotations

from typing import Any

from report.content import finding_summary, gpu_why, money, priced, rec_text, shown


def render_text(doc: dict[str, Any]) -> str:
    """A readable table: one line per GPU, then the class totals."""
    start, end = (shown(doc["window"][k], doc) for k in ("start", "end"))
    lines = [f"window {start} .. {end}", ""]
    header = f"{'node':<16} {'gpu':>3}  {'class':<12} {'conf':>4}  evidence"
    lines += [header, "-" * len(header)]
    for g in doc["gpus"]:
        lines.append(
            f"{g['node']:<16} {g['gpu']:>3}  {g['class']:<12} {g['confidence']:>4.2f}  {gpu_why(g)}"
        )
    counts: dict[str, int] = {}
    for g in doc["gpus"]:
        counts[g["class"]] = counts.get(g["class"], 0) + 1
    lines += ["", "GPUs by class: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
    lines += _findings_text(doc["findings"])
    lines += ["", f"recommendations: {len(doc['recommendations'])}"]
    lines += [f"- [{r['kind']}] {rec_text(r, r['summary'])}" for r in doc["recommendations"]]
    lines += [f"- [{n['kind']}] not enough data: {n['reason']}" for n in doc["not_enough_data"]]
    lines += _owners_text(doc)
    return "\n".join(lines)


def _owners_text(doc: dict[str, Any]) -> list[str]:
    """One line per owner: GPU-hours, idle, idle-held and starved, and cost when priced."""
    owners = doc.get("owners") or []
    if not owners:
        return []
    bill = doc["bill"]
    total = f"{bill['gpu_hours']:.1f} GPU-h" + (
        f", {money(bill['cost'], doc)}" if priced(doc) else ""
    )
    header = f"{'owner':<24} {'kind':<12} {'GPU-h':>8} {'idle':>7} {'held':>7} {'starved':>7}"
    lines = ["", f"owners: {len(owners)} ({total})", header + ("     cost" if priced(doc) else "")]
    lines.append("-" * len(lines[-1]))
    for o in owners:
        cost = f" {money(o['cost'], doc):>8}" if priced(doc) else ""
        lines.append(
            f"{o['owner']:<24} {o['kind']:<12} {o['gpu_hours_total']:>8.1f} "
            f"{o['idle_gpu_hours']:>7.1f} {o['idle_held_gpu_hours']:>7.1f} "
            f"{o['starved_gpu_hours']:>7.1f}{cost}"
        )
    return lines


def _findings_text(findings: list[dict[str, Any]]) -> list[str]:
    if not findings:
        return ["", "no findings"]
    total: dict[str, float] = {}
    for f in findings:
        total[f["kind"]] = total.get(f["kind"], 0.0) + f["gpu_hours_lost"]
    lines = [
        "",
        f"findings: {len(findings)}, costliest first ("
        + ", ".join(f"{k} {v:.1f} GPU-h" for k, v in sorted(total.items()))
        + ")",
    ]
    header = f"{'kind':<15} {'node/gpu':<18} {'GPU-h':>7}  what"
    lines += [header, "-" * len(header)]
    for f in findings:
        what = finding_summary(f)
        where = f"{f['node']}/{f['gpu']}"
        lines.append(f"{f['kind']:<15} {where:<18} {f['gpu_hours_lost']:>7.1f}  {what}")
    return lines
