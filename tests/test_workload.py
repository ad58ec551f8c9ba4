"""The workload identity (analyzer/workload.py) on real-looking command lines and pod names: runs
of one workload get one identity whatever their ranks, ports, seeds, run ids and timestamps;
different workloads (another model, batch size or script) never share one."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.load import Tenant
from analyzer.workload import identity, normalise_command, pod_template

CMDLINES = Path(__file__).resolve().parent.parent / "fixtures" / "cmdlines"


def _lines(name: str) -> list[str]:
    text = (CMDLINES / name).read_text()
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _groups() -> list[list[str]]:
    groups: list[list[str]] = [[]]
    for line in (CMDLINES / "twins.txt").read_text().splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            groups.append([]) if groups[-1] else None
            continue
        groups[-1].append(line)
    return [g for g in groups if g]


def test_runs_of_one_workload_share_its_identity() -> None:
    groups = _groups()
    assert len(groups) >= 12
    for group in groups:
        names = {normalise_command(line) for line in group}
        assert len(names) == 1, group
        assert None not in names


def test_different_workloads_never_share_an_identity() -> None:
    names = [normalise_command(group[0]) for group in _groups()]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("corpus", ["benign-tuning.txt", "benign-heldout.txt"])
def test_every_distinct_command_line_in_the_corpora_keeps_its_own_identity(corpus: str) -> None:
    """The corpora hold 76 different workloads; normalising must not merge any two of them."""
    named = [n for line in _lines(corpus) if (n := normalise_command(line)) is not None]
    assert len(named) >= len(_lines(corpus)) - 6  # notebooks, shells and `python -c` have none
    assert len(set(named)) == len(named)


def test_what_defines_the_work_survives_normalisation() -> None:
    line = (
        "python main.py --arch resnet50 --batch-size 256 --lr 0.1 --seed 3 --rank 2 "
        "--master_port 29512 --output_dir /ckpt/run-20261116-0412"
    )
    assert normalise_command(line) == (
        "python main.py --arch resnet50 --batch-size 256 --lr 0.1 --seed <v> --rank <v> "
        "--master_port <v> --output_dir <v>"
    )
    assert normalise_command("python3 -u /srv/app/serve.py --port=8080") == (
        "python -u /srv/app/serve.py --port <v>"
    )


@pytest.mark.parametrize(
    "line",
    [
        "python",
        "/usr/bin/python3 -m ipykernel_launcher -f /run/kernel-5e2b8c1d-3f4a-4b6c-9d8e.json",
        "/opt/conda/bin/python /opt/conda/bin/jupyter-lab --no-browser --port=8888",
        'python -c "import torch; print(torch.cuda.device_count())"',
        "code-server --bind-addr 0.0.0.0:8443 /home/erin/workspace",
        "bash",
        "",
    ],
)
def test_commands_that_name_no_workload_have_no_identity(line: str) -> None:
    assert normalise_command(line) is None


@pytest.mark.parametrize(
    ("pod", "template"),
    [
        ("sd-serve-6c5b8d9f7b-bwq8z", "sd-serve"),  # Deployment: template hash, random suffix
        ("resnet-50-7d9f8b6c4-x2x9z", "resnet-50"),  # a number in the Deployment's own name
        ("train-llama-x2x9z", "train-llama"),  # Job or DaemonSet: random suffix
        ("nightly-eval-29012345-q7k2p", "nightly-eval"),  # CronJob: scheduled minute, suffix
        ("postgres-0", "postgres"),  # StatefulSet ordinal
        ("train-llama-abcde", "train-llama-abcde"),  # vowels: a word, not a random suffix
        ("web", "web"),
    ],
)
def test_pod_template_drops_what_the_controllers_append(pod: str, template: str) -> None:
    assert pod_template(pod) == template


def _tenant(name: str, command: str, namespace: str | None = None) -> Tenant:
    return Tenant(name, None, None, command, namespace)


def test_identity_is_the_pod_template_then_the_command_never_the_job_id() -> None:
    a = _tenant("pod serving/sd-serve-6c5b8d9f7b-bwq8z", "python python serve.py", "serving")
    b = _tenant("pod serving/sd-serve-6c5b8d9f7b-k7m2t", "python python other.py", "serving")
    assert identity(a) == identity(b) == "pod-template serving/sd-serve"
    job1 = _tenant("slurm job 41000", "python python train.py --seed 1")
    job2 = _tenant("slurm job 52117", "pt_main_thread python3 train.py --seed 2")
    assert identity(job1) == identity(job2) == "cmd python train.py --seed <v>"
    unnamed_pod = _tenant("pod 1b4e4b2c-6f1d-4d6e-9a57-2c1f0f1e3a9b", "python python x.py")
    assert identity(unnamed_pod) == "cmd python x.py"
    assert identity(_tenant("slurm job 7", "python")) is None  # a bare interpreter
