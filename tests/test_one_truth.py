"""One truth in every view (issue 24): the demo's config is found beside its store, and every
figure two views share is the same figure in each."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import REPO, run_aiscope

DEMO_CONFIG = REPO / "aiscope" / "demo-config.toml"


def test_readers_find_the_config_beside_the_store(demo_two_day_store: Path, tmp_path: Path) -> None:
    """``aiscope.toml`` beside the store (where the demo writes it) prices the analysis and sets
    up notify without --config; without it nothing is priced; --config still wins."""
    store = tmp_path / "demo.duckdb"
    shutil.copyfile(demo_two_day_store, store)
    bare = json.loads(run_aiscope("analyze", "--store", str(store)).stdout)
    assert bare["bill"]["cost"] is None
    (tmp_path / "aiscope.toml").write_text(DEMO_CONFIG.read_text())
    found = run_aiscope("analyze", "--store", str(store))
    assert found.returncode == 0, found.stderr
    doc = json.loads(found.stdout)
    assert doc["bill"]["cost"] and doc["bill"]["currency"] == "USD"
    assert {"llm", "research"} <= {o["owner"] for o in doc["owners"]}
    other = tmp_path / "other.toml"
    other.write_text('[prices]\ncurrency = "EUR"\ngpu_hour = 1.0\n')
    explicit = json.loads(
        run_aiscope("analyze", "--store", str(store), "--config", str(other)).stdout
    )
    assert explicit["bill"]["currency"] == "EUR"
    notify = run_aiscope("notify", "--store", str(store), "--dry-run")
    assert notify.returncode == 0, notify.stderr
    assert "would mail the weekly report to gpu-platform@example.com" in notify.stdout
