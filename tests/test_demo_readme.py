"""The demo's files, read again (issue 24): the README's commands that re-analyze, plan and notify
from ``aiscope-demo/`` run as written, and find the demo's config beside its store."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, run_aiscope

DEMO_CONFIG = REPO / "aiscope" / "demo-config.toml"


def readme_demo_commands() -> list[list[str]]:
    """The ``aiscope ...`` lines of the README's shell block that reads ``aiscope-demo/``'s
    store, comments dropped, split as a shell would."""
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    block = next(b for b in blocks if "aiscope-demo/demo.duckdb" in b)
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line]


def _demo_dir(tmp_path: Path, store: Path) -> Path:
    """``aiscope-demo/`` as ``aiscope demo`` leaves it: the store and its config beside it."""
    out = tmp_path / "aiscope-demo"
    out.mkdir()
    shutil.copyfile(store, out / "demo.duckdb")
    shutil.copyfile(DEMO_CONFIG, out / "aiscope.toml")
    return out


def test_the_readmes_demo_commands_run_as_written(demo_two_day_store: Path, tmp_path: Path) -> None:
    """Each command of the README's block, exactly as written, from the directory the demo ran
    in: exit 0, and the owners, money and notices of the config beside the store."""
    _demo_dir(tmp_path, demo_two_day_store)
    commands = readme_demo_commands()
    verbs = [c[1] for c in commands]
    assert verbs == ["analyze", "report", "job", "plan", "notify"], verbs
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    said: dict[str, str] = {}
    for command in commands:
        assert command[0] == "aiscope", command
        done = subprocess.run(
            [sys.executable, "-m", "aiscope", *command[1:]],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env=env,
            check=False,
        )
        assert done.returncode == 0, (command, done.stderr)
        assert "config: aiscope-demo/aiscope.toml (beside the store)" in done.stderr, command
        said[command[1]] = done.stdout
    assert re.search(r"^owners: \d+ \(.*\$[\d,]+\)$", said["analyze"], re.M), said["analyze"]
    assert {"llm", "search", "support"} <= set(re.findall(r"^(\w+) +team ", said["analyze"], re.M))
    # the support assistant's four replicas fit on fewer GPUs, and only they: the GPU a kernel
    # holds idle (gpu-node-04/6) needs a whole device, so it is no candidate
    packs = re.findall(r"^- \[consolidate\] (Pack .*)$", said["analyze"], re.M)
    assert len(packs) == 1, said["analyze"]
    assert re.fullmatch(
        r"Pack 4 lightly used NVIDIA H100 80GB HBM3 GPUs onto [123] with MIG \(.*\), freeing "
        r"[123]: gpu-node-05/0, gpu-node-05/1, gpu-node-05/2, gpu-node-05/3",
        packs[0],
    ), packs
    assert (tmp_path / "aiscope-demo" / "again.html").stat().st_size > 1000
    assert said["job"].startswith("slurm job 41000 (user priya, owner llm)")
    assert " USD" in said["job"]  # priced by the config beside the store
    assert said["plan"].startswith("Capacity plan:")
    assert "would mail the weekly report to gpu-platform@example.com" in said["notify"]


def test_readers_find_the_config_beside_the_store(demo_two_day_store: Path, tmp_path: Path) -> None:
    """Without ``aiscope.toml`` beside the store nothing is priced; --config wins over it."""
    store = tmp_path / "demo.duckdb"
    shutil.copyfile(demo_two_day_store, store)
    bare = json.loads(run_aiscope("analyze", "--store", str(store)).stdout)
    assert bare["bill"]["cost"] is None
    (tmp_path / "aiscope.toml").write_text(DEMO_CONFIG.read_text())
    other = tmp_path / "other.toml"
    other.write_text('[prices]\ncurrency = "EUR"\ngpu_hour = 1.0\n')
    explicit = json.loads(
        run_aiscope("analyze", "--store", str(store), "--config", str(other)).stdout
    )
    assert explicit["bill"]["currency"] == "EUR"
