"""Declared intent, collected: pod owner chains from recorded API-server answers (a real local
HTTP server), Slurm modes from cgroups, environments and recorded ``scontrol`` answers,
systemd units and process signatures from process tables, and the store's schema 2 -> 3
migration."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import duckdb
import pytest

from agent.attribution import ProcReader
from agent.k8s import PodDirectory
from agent.slurm import SlurmJobs, parse_scontrol
from agent.store import Store
from store import intent
from store.schema import (
    ALL_RECORDS,
    ROLLUP_COLUMNS,
    SCHEMA_VERSION,
    Declaration,
    GpuSample,
    create_table_sql,
    rollup_table_sql,
)
from store.storefile import read_records
from tests.conftest import FIXTURES, query

K8S = FIXTURES / "k8s"
NODE = "gpu-node-07"


class _ApiServer(BaseHTTPRequestHandler):
    """Answers the pod list and, unless ``forbid_owners``, each owner object, as recorded."""

    forbid_owners: ClassVar[bool] = False
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(self.path)
        if self.path.startswith("/api/v1/pods?"):
            self._send(200, (K8S / "pods.json").read_bytes())
            return
        owners = json.loads((K8S / "owners.json").read_text())
        if self.forbid_owners:
            body = {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
            self._send(403, json.dumps(body).encode())
        elif self.path in owners:
            self._send(200, json.dumps(owners[self.path]).encode())
        else:
            self._send(404, b'{"kind": "Status", "reason": "NotFound", "code": 404}')

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[str]:
    _ApiServer.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ApiServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    _ApiServer.forbid_owners = False


#: pod name -> (kind, name, implies) every pod in pods.json must declare.
EXPECTED = {
    "chat-x-7d9f8b6c5d-x2kqp": ("Deployment", "chat/chat-x", "inference"),
    "embed-db-0": ("StatefulSet", "search/embed-db", None),
    "eval-run-42-8lq2z": ("Job", "research/eval-run-42", None),
    "nightly-embed-29412960-z7d4k": ("CronJob", "ml/nightly-embed", "batch"),
    "nvidia-dcgm-exporter-6kq8v": ("DaemonSet", "gpu-operator/nvidia-dcgm-exporter", None),
    "llama-405b-0": ("LeaderWorkerSet", "llm/llama-405b", "inference"),
    "gpt-pretrain-worker-3": ("PyTorchJob", "train/gpt-pretrain", "training"),
    "allreduce-bench-worker-0": ("MPIJob", "train/allreduce-bench", "training"),
    "resnet-tf-worker-1": ("TFJob", "train/resnet-tf", "training"),
    "adhoc-raycluster-gpu-group-worker-p8x7t": ("RayCluster", "ray/adhoc-raycluster", None),
    "tune-job-raycluster-k9w2q-gpu-worker-h2m4n": ("RayJob", "ray/tune-job", None),
    "sd-service-raycluster-x7j5c-gpu-worker-4tq9w": ("RayService", "ray/sd-service", "inference"),
    "nb-0": ("Notebook", "alice/nb", "interactive"),
    "sdxl-predictor-5c8b7f9d4-mk2jp": ("InferenceService", "kserve-demo/sdxl", "inference"),
    "cuda-smoke": ("Pod", "scratch/cuda-smoke", None),
}


def _declared(pods: PodDirectory) -> dict[str, Declaration]:
    names = {f"pod:{p.uid}": p.name for p in pods.snapshot()[0]}
    return {names[d.subject]: d for d in pods.declarations()}


@pytest.mark.parametrize("forbid_owners", [False, True], ids=["owners-read", "rules-only"])
def test_every_owner_kind_and_bare_pods(api: str, forbid_owners: bool) -> None:
    """With owner lookups answered, the chain is read; refused (403: RBAC without ``get``),
    the controllers' name rules and labels name the same owners."""
    _ApiServer.forbid_owners = forbid_owners
    pods = PodDirectory(NODE, api, clock=lambda: 500.0)
    assert len(pods.refresh()) == 16
    # Each refused owner is counted with the API failures (exported), none when answered.
    assert pods.snapshot()[1] == (12 if forbid_owners else 0)
    got = _declared(pods)
    assert {k: (d.kind, d.name, d.implies) for k, d in got.items()} == EXPECTED
    assert "debug-gpu" not in got  # a bare pod with nothing allow-listed declares nothing
    assert all(d.source == "kubernetes" and d.last_seen_ts == 500.0 for d in got.values())
    chain = json.loads(got["sdxl-predictor-5c8b7f9d4-mk2jp"].attributes or "{}")["owners"]
    if forbid_owners:
        assert chain == ["ReplicaSet/sdxl-predictor-5c8b7f9d4", "Deployment/sdxl-predictor"]
    else:
        assert chain == [
            "ReplicaSet/sdxl-predictor-5c8b7f9d4",
            "Deployment/sdxl-predictor",
            "InferenceService/sdxl",
        ]


def test_owner_lookups_are_cached(api: str) -> None:
    pods = PodDirectory(NODE, api)
    pods.refresh()
    first = len(_ApiServer.seen)
    pods.refresh()
    assert len(_ApiServer.seen) == first + 1  # the pod list only


def test_only_allow_listed_keys_are_kept_and_values_redacted(api: str) -> None:
    pods = PodDirectory(NODE, api)
    pods.refresh()
    chat = json.loads(_declared(pods)["chat-x-7d9f8b6c5d-x2kqp"].attributes or "{}")
    assert chat["priority_class"] == "production-serving"
    assert set(chat["labels"]) == {
        "app.kubernetes.io/name",
        "app.kubernetes.io/component",
        "app.kubernetes.io/note",
    }  # not team, pod-template-hash, prometheus.io/scrape or kubectl's restartedAt
    assert "ghp_" not in chat["labels"]["app.kubernetes.io/note"]
    queue = json.loads(_declared(pods)["eval-run-42-8lq2z"].attributes or "{}")
    assert queue["labels"] == {"kueue.x-k8s.io/queue-name": "research-queue"}
    assert queue["priority_class"] == "batch-low"


def test_name_rules() -> None:
    assert intent.deployment_of("chat-x-7d9f8b6c5d", "7d9f8b6c5d") == "chat-x"
    assert intent.deployment_of("handmade-rs", "7d9f8b6c5d") is None
    assert intent.deployment_of("chat-x-7d9f8b6c5d", None) == "chat-x"  # by the hash alphabet
    assert intent.deployment_of("chat-x-latest", None) is None
    assert intent.cronjob_of("nightly-embed-29412960") == "nightly-embed"
    assert intent.cronjob_of("eval-run-42") is None


# -- process tables: Slurm, systemd, signatures ------------------------------------------------

#: pid -> (comm, argv, cgroup path, environment): shapes seen on GPU nodes.
TABLE: dict[int, tuple[str, list[str], str, list[str]]] = {
    # sbatch's batch step (cgroup v2), environment readable.
    5101: (
        "python",
        ["python", "-m", "torch.distributed.run", "--nproc_per_node=8", "train.py"],
        "/system.slice/slurmstepd.scope/job_51234/step_batch/user/task_0",
        [
            "SLURM_JOB_ID=51234",
            "SLURM_JOB_NAME=llama-ft",
            "SLURM_JOB_PARTITION=gpu",
            "SLURM_JOB_QOS=normal",
            "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123",
        ],
    ),
    # srun --pty bash inside an allocation: the pty port says interactive.
    5102: (
        "python",
        ["python", "debug_kernel.py"],
        "/slurm/uid_1001/job_51300/step_0/task_0",
        [
            "SLURM_JOB_ID=51300",
            "SLURM_JOB_NAME=bash",
            "SLURM_PTY_PORT=40123",
            "SLURM_JOB_PARTITION=interactive",
        ],
    ),
    # Another user's step: environment unreadable; scontrol decides (BatchFlag=0: salloc).
    5103: ("python", ["python", "probe.py"], "/slurm/uid_1002/job_51400/step_0/task_0", []),
    # salloc with use_interactive_step.
    5104: (
        "ipykernel",
        ["python", "-m", "ipykernel_launcher", "-f", "/run/k.json"],
        "/system.slice/slurmstepd.scope/job_51500/step_interactive/user/task_0",
        [],
    ),
    # A systemd service running vLLM, and a user's jupyter under its own unit.
    5201: (
        "vllm",
        ["/opt/venv/bin/vllm", "serve", "Qwen/Qwen2.5-7B", "--port", "8000"],
        "/system.slice/vllm-qwen.service",
        [],
    ),
    5202: (
        "jupyter-lab",
        ["/opt/conda/bin/python", "/opt/conda/bin/jupyter-lab", "--no-browser"],
        "/system.slice/jupyter-user1000.service",
        [],
    ),
    # Bare processes: signatures only.
    5301: (
        "python3",
        ["python3", "-m", "sglang.launch_server", "--model-path", "m"],
        "/user.slice",
        [],
    ),
    5302: ("tritonserver", ["tritonserver", "--model-repository=/models"], "/user.slice", []),
    5303: (
        "text-generation-launcher",
        ["text-generation-launcher", "--model-id", "m"],
        "/user.slice",
        [],
    ),
    5304: ("java", ["torchserve", "--start", "--model-store", "/ms"], "/user.slice", []),
    5305: ("python", ["python", "-m", "ray.serve", "run", "app:d"], "/user.slice", []),
    5306: (
        "serve",
        ["/usr/bin/python3", "/usr/local/bin/serve", "run", "config.yaml"],
        "/user.slice",
        [],
    ),
    5307: (
        "code-server",
        ["/usr/lib/code-server/lib/node", "/usr/bin/code-server"],
        "/user.slice",
        [],
    ),
    5308: ("torchrun", ["/usr/bin/torchrun", "--nnodes=2", "train.py"], "/user.slice", []),
    5309: ("deepspeed", ["deepspeed", "--num_gpus=8", "finetune.py"], "/user.slice", []),
    5310: ("accelerate", ["accelerate", "launch", "sft.py"], "/user.slice", []),
    5311: (
        "python",
        ["python", "pretrain_gpt.py", "--tensor-model-parallel-size", "8"],
        "/user.slice",
        [],
    ),
    5312: ("vllm", ["vllm", "bench", "throughput", "--model", "m"], "/user.slice", []),
    5313: ("python", ["python", "train_resnet.py"], "/user.slice", []),
}
SCONTROL = {
    "51400": "JobId=51400 JobName=probe run UserId=bob(1002) GroupId=bob(1002) Priority=4294901 "
    "QOS=debug JobState=RUNNING BatchFlag=0 Partition=gpu-debug NodeList=gpu-node-07",
}


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    for pid, (comm, argv, cgroup, environ) in TABLE.items():
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "comm").write_text(comm + "\n")
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (d / "cgroup").write_text(f"0::{cgroup}\n")
        (d / "stat").write_text(
            f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 1 0 0 0 5 3 0 0 "
            f"20 0 8 0 {pid * 10} 1 1 18446744073709551615"
        )
        (d / "status").write_text("Uid:\t1001\t1001\t1001\t1001\n")
        if environ:
            (d / "environ").write_bytes(b"\0".join(e.encode() for e in environ) + b"\0")
    return tmp_path


def _declare(proc: Path, pid: int, calls: list[list[str]] | None = None) -> dict[str, Declaration]:
    def runner(argv: list[str]) -> str | None:
        (calls if calls is not None else []).append(argv)
        return SCONTROL.get(argv[-1], f"slurm_load_jobs error: Invalid job id {argv[-1]}")

    reader = ProcReader(proc, user_name=str, slurm_jobs=SlurmJobs(runner))
    process = reader.attribute(pid, NODE, 7.0)
    assert process is not None
    return {d.source: d for d in reader.declare(process, 7.0)}


def test_slurm_batch_from_the_cgroup_with_name_partition_and_qos(proc: Path) -> None:
    got = _declare(proc, 5101)
    slurm, cmd = got["slurm"], got["cmdline"]
    assert (slurm.subject, slurm.kind, slurm.name, slurm.implies) == (
        "slurm:51234",
        "slurm batch",
        "llama-ft",
        None,
    )
    assert json.loads(slurm.attributes or "{}") == {
        "job_id": "51234",
        "partition": "gpu",
        "qos": "normal",
    }
    assert (cmd.kind, cmd.implies, cmd.subject) == ("torchrun", "training", "slurm:51234")
    assert "hf_" not in (slurm.attributes or "")  # nothing else of the environment


def test_slurm_interactive_from_srun_pty_salloc_step_and_scontrol(proc: Path) -> None:
    calls: list[list[str]] = []
    assert _declare(proc, 5102, calls)["slurm"].kind == "slurm interactive"
    assert _declare(proc, 5104, calls)["slurm"].kind == "slurm interactive"
    assert calls == [["scontrol", "show", "job", "--oneliner", "51500"]]  # no name known
    by_scontrol = _declare(proc, 5103, calls)["slurm"]
    assert (by_scontrol.kind, by_scontrol.name, by_scontrol.implies) == (
        "slurm interactive",
        "probe run",
        "interactive",
    )
    assert json.loads(by_scontrol.attributes or "{}")["qos"] == "debug"


def test_scontrol_answers() -> None:
    job = parse_scontrol("51400", SCONTROL["51400"])
    assert job is not None and job.interactive is True and job.partition == "gpu-debug"
    batch = parse_scontrol("7", "JobId=7 JobName=train UserId=a(1) BatchFlag=1 Partition=p QOS=q")
    assert batch is not None and batch.kind == "slurm batch" and batch.name == "train"
    assert parse_scontrol("8", "slurm_load_jobs error: Invalid job id specified") is None
    unknown = SlurmJobs(lambda argv: None)
    assert unknown.lookup("9") is None and unknown.lookup("9") is None


def test_systemd_units_and_signatures(proc: Path) -> None:
    unit = _declare(proc, 5201)
    assert (unit["systemd"].kind, unit["systemd"].name) == ("systemd unit", "vllm-qwen.service")
    assert (unit["cmdline"].kind, unit["cmdline"].implies) == ("vllm", "inference")
    assert unit["cmdline"].subject == "unit:vllm-qwen.service"
    assert _declare(proc, 5202)["cmdline"].kind == "jupyter"
    signatures = {pid: _declare(proc, pid).get("cmdline") for pid in range(5301, 5314)}
    assert {pid: d.kind if d else None for pid, d in signatures.items()} == {
        5301: "sglang",
        5302: "tritonserver",
        5303: "text-generation-launcher",
        5304: "torchserve",
        5305: "ray serve",
        5306: "ray serve",
        5307: "code-server",
        5308: "torchrun",
        5309: "deepspeed",
        5310: "accelerate",
        5311: "megatron",
        5312: "vllm bench",
        5313: None,
    }
    assert signatures[5312] is not None and signatures[5312].implies == "batch"
    assert (signatures[5301] or signatures[5312]).subject.startswith("process:5301:")


def test_declarations_through_the_sampler_land_in_the_store(tmp_path: Path) -> None:
    """A simulated store: every workload's process declares what its command line says."""
    from sim.engine import simulate
    from sim.scenario import load

    path = tmp_path / "s.duckdb"
    simulate(load("inference-diurnal"), path, days=0.05)
    rows = read_records(path, Declaration)
    assert rows and all(r.subject.startswith(("pod:", "slurm:", "unit:")) for r in rows)
    assert {r.kind for r in rows if r.source == "cmdline"} >= {"vllm"}


# -- schema 3 -------------------------------------------------------------------------------------


def _v2_store(path: Path) -> None:
    """A store as schema 2 wrote it: no declarations table, meta at version 2."""
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    for record in ALL_RECORDS:
        if record is not Declaration:
            con.execute(create_table_sql(record))
    for table in ROLLUP_COLUMNS:
        con.execute(rollup_table_sql(table))
    con.execute(
        "INSERT INTO gpu_samples (ts, node, uuid, gpu_index, up, utilization_gpu_ratio, source) "
        "VALUES (1764000000.0, 'n', 'GPU-1', 0, true, 0.5, 'agent')"
    )
    con.close()


def test_a_v2_store_is_read_as_it_is_and_migrated_when_written(tmp_path: Path) -> None:
    path = tmp_path / "v2.duckdb"
    _v2_store(path)
    assert read_records(path, Declaration) == []  # a reader takes it as it is
    assert query(path, "SELECT value FROM meta WHERE key = 'schema_version'") == [("2",)]
    store = Store(path)
    declared = Declaration("n", "pod:u", "kubernetes", "Deployment", "a/b", "inference", None, 9.0)
    store.add([GpuSample(1_764_000_060.0, "n", "GPU-1", 0, True, 0.4), declared])
    store.flush()
    store.close()
    assert query(path, "SELECT value FROM meta WHERE key = 'schema_version'") == [
        (str(SCHEMA_VERSION),)
    ]
    assert SCHEMA_VERSION == 3
    assert read_records(path, Declaration) == [declared]
    assert query(path, "SELECT count(*) FROM gpu_samples") == [(2,)]  # nothing lost
