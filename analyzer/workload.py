"""What a workload *is*, apart from which job ran it: the one identity function (issue #23, 5).

Two tenants are the same workload when they run the same thing: the same command line with its
per-run arguments normalised away, or pods stamped from the same template. A Slurm job id, a
pod's random suffix, a rank, a port or a seed says which *run* it was, never which workload, so
a job whose twin ran alone on another GPU for hours can be measured against that twin.

* **Pods** (the pod's name known): ``pod-template NAMESPACE/OWNER``, the pod's name without what
  the controllers append to it: a Deployment's ``-<pod-template-hash>-<5 random>``, a Job's or
  DaemonSet's ``-<5 random>``, a CronJob's ``-<scheduled minute>-<5 random>``, a StatefulSet's
  or LeaderWorkerSet's ``-<ordinal>``. The random suffix uses Kubernetes' own alphabet
  (``k8s.io/apimachinery/pkg/util/rand``: consonants and the digits 2, 4-9, no vowels), so words
  in a name are not mistaken for one.
* **Everything else**: ``cmd <normalised command line>``. The interpreter's path and version go
  (``/opt/conda/bin/python3.11`` is ``python``); the values of per-run options go (ranks, ports,
  seeds, addresses, rendezvous and run ids, run names, output directories); and, in every
  argument, UUIDs, long hex digests, timestamps and dates, IP addresses, host ports, and the
  numbers of run, step, shard or epoch directories in paths. What defines the work stays: the
  script or module, the model, the batch size, the config file.
* **No identity** (``None``): a command that names no workload of its own (a bare interpreter,
  ``python -c``, a shell, a notebook kernel or server, an editor), whose solo level says nothing
  about another session's.
"""

from __future__ import annotations

import re
import shlex

from analyzer.load import Tenant

#: Kubernetes' random-suffix alphabet (k8s.io/apimachinery/pkg/util/rand: no vowels, no 0 1 3).
_K8S_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_RANDOM5 = re.compile(rf"-[{_K8S_ALPHABET}]{{5}}$")
_TEMPLATE_HASH = re.compile(rf"-(?=[{_K8S_ALPHABET}]*\d)[{_K8S_ALPHABET}]{{6,10}}$")
_SCHEDULED_MINUTE = re.compile(r"-\d{8,}$")  # a CronJob's Job: minutes since the epoch
_ORDINAL = re.compile(r"-\d+$")

#: Option names (their last word, split at ``- _ .``) whose value says which run, not what work.
_RUN_WORDS = frozenset(
    {
        "rank", "port", "seed", "addr", "address", "ip", "endpoint", "hostfile", "jobid", "url",
        "uuid", "timestamp", "date", "time",
    }
)  # fmt: skip
#: Whole option names (normalised to ``_``) with the same meaning.
_RUN_OPTIONS = frozenset(
    {
        "name", "run", "run_id", "run_name", "job_name", "exp_name", "experiment_name",
        "rdzv_id", "wandb_run_name", "output", "output_dir", "outdir", "out_dir", "output_path",
        "save", "save_dir", "save_folder", "save_path", "work_dir", "logdir", "log_dir",
        "logging_dir", "exp_dir", "results_dir",
    }
)  # fmt: skip
#: Programs and modules that name no workload of their own.
_NO_WORKLOAD = frozenset(
    {
        "python", "bash", "sh", "zsh", "ipykernel_launcher", "ipykernel", "jupyter",
        "jupyter-lab", "jupyter-notebook", "jupyter-server", "notebook", "code-server",
        "sleep", "tail",
    }
)  # fmt: skip
_INTERPRETER = re.compile(r"^(python|pypy)[\d.]*$")

_NUMBERED = "run|exp|trial|step|epoch|iter|job|shard|rank|worker|attempt|seed|ckpt"
_SUBSTITUTIONS = (
    (re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"), "<uuid>"),
    # digests and commits: 12+ hex characters with a letter and a digit among them
    (re.compile(r"(?:sha256:)?\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{12,}\b"), "<hex>"),
    # ISO dates and times (2024-06-11, 2024-06-11T13:45:02Z)
    (re.compile(r"\d{4}-\d{2}-\d{2}(?:[T_ ]\d{2}[:-]?\d{2}(?:[:-]?\d{2}(?:\.\d+)?)?Z?)?"), "<ts>"),
    # compact dates with an optional time (20240611, 2024_06_11, 20240611-1345)
    (re.compile(r"(?<!\d)(?:19|20)\d{2}[_-]?[01]\d[_-]?[0-3]\d(?:[T_-]?\d{4,6})?(?!\d)"), "<ts>"),
    # Unix time in seconds or milliseconds, 2017 to 2033
    (re.compile(r"(?<![\d.])1[5-9]\d{8}(?:\d{3})?(?![\d.])"), "<ts>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b"), "<ip>"),
    (re.compile(r"(?<=[A-Za-z0-9>\]]):\d{2,5}(?![\w.-])"), ":<port>"),  # not an image tag
    # the number of a run, step, shard ... directory or file (runs/exp12, step_120000)
    (re.compile(rf"(?i)\b({_NUMBERED})([-_]?)\d+\b"), r"\1\2<n>"),
)  # fmt: skip


def pod_template(pod_name: str) -> str:
    """The pod's template name: ``pod_name`` without its controller's suffixes."""
    name = pod_name
    if _RANDOM5.search(name):
        name = _RANDOM5.sub("", name)
        if _TEMPLATE_HASH.search(name):
            return _TEMPLATE_HASH.sub("", name)
        return _SCHEDULED_MINUTE.sub("", name)
    return _ORDINAL.sub("", name)


def _words(token: str) -> list[str]:
    return [w for w in re.split(r"[^A-Za-z0-9]+", token.lower()) if w]


def _is_run_option(key: str) -> bool:
    """``--master_port``, ``--seed``, ``trainer.run_name`` and the like."""
    bare = key.lstrip("-").lower()
    _, dot, last = bare.rpartition(".")
    words = _words(last)
    if not words:
        return False
    joined = "_".join(words)
    # A nested key's bare ``name`` or ``output`` is a setting (``model.optim.sched.name``).
    return words[-1] in _RUN_WORDS or (joined in _RUN_OPTIONS and not (dot and "_" not in joined))


def _scrub(token: str) -> str:
    for pattern, replacement in _SUBSTITUTIONS:
        token = pattern.sub(replacement, token)
    return token


def _split(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:  # an unbalanced quote (a truncated /proc cmdline): split on blanks
        return command.split()


def _program(token: str) -> str:
    base = token.rsplit("/", 1)[-1]
    return "python" if _INTERPRETER.match(base) else base


def _long_options_split(args: list[str]) -> list[str]:
    """``--key=value`` as ``--key value``: the two spellings are the same run."""
    out: list[str] = []
    for arg in args:
        key, eq, value = arg.partition("=")
        out += [key, value] if eq and arg.startswith("--") else [arg]
    return out


def _normalised_args(args: list[str]) -> list[str]:
    out: list[str] = []
    skip_value = False
    for arg in _long_options_split(args):
        if skip_value and not arg.startswith("-"):
            out.append("<v>")
            skip_value = False
            continue
        skip_value = False
        key, eq, _ = arg.partition("=")
        if eq and _is_run_option(key) and (key.startswith("-") or "." in key or key.isidentifier()):
            out.append(f"{key}=<v>")
        elif arg.startswith("-") and _is_run_option(arg):
            out.append(arg)
            skip_value = True
        else:
            out.append(_scrub(arg))
    return out


def _names_no_workload(argv: list[str]) -> bool:
    """A bare interpreter, ``python -c``, a shell, a notebook kernel or server."""
    program = argv[0]
    if program in _NO_WORKLOAD - {"python"}:
        return True
    if program != "python":
        return False
    rest = argv[1:]
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
        rest = rest[1:]  # interpreter flags: -u, -O, -X ...
    if not rest or rest[0] == "-c":
        return True
    target = rest[1] if rest[0] == "-m" and len(rest) > 1 else rest[0]
    return target.rsplit("/", 1)[-1] in _NO_WORKLOAD


def normalise_command(command: str) -> str | None:
    """``command`` (already redacted) with its per-run arguments normalised; ``None`` when it
    names no workload of its own."""
    argv = _split(command.strip())
    if not argv:
        return None
    argv = [_program(argv[0]), *argv[1:]]
    if _names_no_workload(argv):
        return None
    return " ".join([argv[0], *_normalised_args(argv[1:])])


def _command_line(tenant: Tenant) -> str:
    """The tenant's command line: the loader stores ``comm`` then the command line; the first
    word is the short name (``pt_main_thread``) when a command line follows it."""
    comm, _, rest = tenant.command.strip().partition(" ")
    return rest.strip() or comm


def identity(tenant: Tenant) -> str | None:
    """The workload ``tenant`` runs, comparable across jobs, GPUs and nodes; ``None`` when the
    telemetry does not say what it is."""
    if tenant.namespace and tenant.name.startswith("pod "):
        pod = tenant.name.removeprefix("pod ")
        namespace, _, name = pod.partition("/")
        if name:
            return f"pod-template {namespace}/{pod_template(name)}"
    command = normalise_command(_command_line(tenant))
    return f"cmd {command}" if command is not None else None
