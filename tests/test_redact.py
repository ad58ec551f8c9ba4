"""Redaction: anything that looks like a credential is dropped, everything else stays readable.

Properties (Hypothesis): a generated secret in any supported position never survives, neither
the agent's argv pass nor the store's pass on a joined line; both are idempotent; benign
arguments survive. Cases: every form issue #16 listed, and the two corpora of real-looking GPU
command lines (fixtures/cmdlines) unchanged.
"""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from agent.redact import (
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_cmdline,
    redact_environment_entry,
    redact_text,
)
from agent.store import Store
from ingest.importer import import_files
from store.schema import Process, observed_process
from tests.conftest import FIXTURES, query

R = REDACTED


def _corpus(name: str) -> list[str]:
    text = (FIXTURES / "cmdlines" / f"{name}.txt").read_text()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


# -- the forms issue #16 found leaking -------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["env", "PGPASSWORD=hunter2", "psql"], ["env", f"PGPASSWORD={R}", "psql"]),
        (["MYSQL_PWD=hunter2", "mysql"], [f"MYSQL_PWD={R}", "mysql"]),
        (["mysql", "-u", "root", "-phunter2", "db"], ["mysql", "-u", "root", f"-p{R}", "db"]),
        (["mysql", "-u", "root", "-p", "db"], ["mysql", "-u", "root", "-p", "db"]),
        (["sshpass", "-p", "hunter2", "ssh", "h"], ["sshpass", "-p", R, "ssh", "h"]),
        (["app", "--pw=hunter2"], ["app", f"--pw={R}"]),
        (["app", "--pw", "hunter2"], ["app", "--pw", R]),
        (
            ["curl", "-H", "Authorization: Bearer abc.def", "https://api"],
            ["curl", "-H", f"Authorization: Bearer {R}", "https://api"],
        ),
        (["curl", "-H", "X-Api-Key: hunter2", "u"], ["curl", "-H", f"X-Api-Key: {R}", "u"]),
        (["curl", "-u", "alice:hunter2", "u"], ["curl", "-u", f"alice:{R}", "u"]),
        (["curl", "--user=alice:hunter2"], ["curl", f"--user=alice:{R}"]),
        (["docker", "run", "-u", "1000:1000", "-p", "80:80"], None),
        (
            ["java", "-Djavax.net.ssl.keyStorePassword=hunter2", "-Xmx4g", "-jar", "a.jar"],
            ["java", f"-Djavax.net.ssl.keyStorePassword={R}", "-Xmx4g", "-jar", "a.jar"],
        ),
        (["java", "-Ddb.password=hunter2"], ["java", f"-Ddb.password={R}"]),
        (
            ["python", "x.py", "--config", '{"api_key": "hunter2", "lr": 0.1}'],
            ["python", "x.py", "--config", f'{{"api_key": "{R}", "lr": 0.1}}'],
        ),
        (
            ["python", "x.py", "--cfg={'password': 'hunter2', 'epochs': 3}"],
            ["python", "x.py", f"--cfg={{'password': '{R}', 'epochs': 3}}"],
        ),
        (["spark-submit", "--conf", "spark.hadoop.fs.s3a.secret.key=hunter2"], None),
        (["docker", "login", "-u", "bob", "-p", "hunter2", "nvcr.io"], None),
        (["wandb", "login", "hunter2"], ["wandb", "login", R]),
        (["redis-cli", "-a", "hunter2", "ping"], ["redis-cli", "-a", R, "ping"]),
        (["keytool", "-list", "-storepass", "hunter2"], ["keytool", "-list", "-storepass", R]),
        (
            ["bash", "-c", "PGPASSWORD=hunter2 psql -h db && mysql -phunter2"],
            ["bash", "-c", f"PGPASSWORD={R} psql -h db && mysql -p{R}"],
        ),
        (["git", "clone", "https://oauth2:hunter2@gitlab.example/x.git"], None),
        (
            ["az", "--conn", "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=hunter2=="],
            None,
        ),
    ],
)
def test_each_leaking_form_is_redacted(argv: list[str], expected: list[str] | None) -> None:
    out = redact_argv(argv)
    if expected is not None:
        assert out == expected
    secret_free = " ".join(out)
    assert "hunter2" not in secret_free
    assert redact_cmdline(" ".join(argv)) == redact_cmdline(secret_free)


# -- issue #27: secret forms never named before, redacted by class ------------------------------

_HEX40 = "9f3b2c8d4e5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c"  # 40 hex: a W&B key, or a git commit by shape


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # positional passwords of known programs
        (
            ["htpasswd", "-b", "/etc/nginx/.htpasswd", "alice", "hunter2"],
            ["htpasswd", "-b", "/etc/nginx/.htpasswd", "alice", R],
        ),
        (
            ["htpasswd", "-bcB", "-C", "12", "users", "alice", "hunter2"],
            ["htpasswd", "-bcB", "-C", "12", "users", "alice", R],
        ),
        (["htpasswd", "-nb", "alice", "hunter2"], ["htpasswd", "-nb", "alice", R]),
        (["htpasswd", "-c", "users", "alice"], None),  # prompts: nothing to drop
        (
            ["smbclient", "//nas/share", "-U", "alice%hunter2"],
            ["smbclient", "//nas/share", "-U", f"alice%{R}"],
        ),
        (["smbclient", "//nas/share", "--user=alice%hunter2"], None),
        (["smbclient", "//nas/share", "hunter2", "-U", "alice"], None),
        (["rpcclient", "-U", "DOM\\alice%hunter2", "dc1"], None),
        (["ldapsearch", "-x", "-D", "cn=admin", "-w", "hunter2", "-b", "dc=x"], None),
        (["mongosh", "-u", "admin", "-p", "hunter2", "db1"], None),
        (["sqlcmd", "-S", "db", "-U", "sa", "-P", "hunter2"], None),
        (["ipmitool", "-H", "bmc1", "-U", "root", "-P", "hunter2", "power", "status"], None),
        (["unzip", "-P", "hunter2", "data.zip"], None),
        (["7z", "x", "-phunter2", "data.7z"], ["7z", "x", f"-p{R}", "data.7z"]),
        # option names that end in or contain a secret word as one word
        (["redis-server", "--requirepass", "hunter2"], ["redis-server", "--requirepass", R]),
        (["redis-server", "--masterauth", "hunter2"], ["redis-server", "--masterauth", R]),
        (["app", "--adminpass=hunter2"], ["app", f"--adminpass={R}"]),
        (["app", "--dbpassword", "hunter2"], None),
        (["app", "--jwtsecret", "hunter2"], None),
        (["app", "--licensekey", "hunter2"], None),
        (["nmcli", "dev", "wifi", "connect", "lab", "--psk", "hunter2"], None),
        # key names inside code strings
        (["python", "-c", f"import os;os.environ['WANDB_API_KEY']='{_HEX40}';import train"], None),
        (["python", "-c", f'import os; os.environ["HF_TOKEN"] = "{_HEX40}"'], None),
        (["python", "-c", f"X_TOKEN = '{_HEX40}'; run(X_TOKEN)"], None),
        (["python", "-c", f"import os; os.environ.setdefault('MY_SECRET', '{_HEX40}')"], None),
        (["python", "-c", "import os; os.putenv('DB_PASSWORD', 'hunter2')"], None),
        (["bash", "-c", f"export WANDB_API_KEY={_HEX40} && python train.py"], None),
    ],
)
def test_each_form_issue_27_found_is_redacted(argv: list[str], expected: list[str] | None) -> None:
    out = redact_argv(argv)
    if expected is not None:
        assert out == expected
    secret_free = " ".join(out)
    assert "hunter2" not in secret_free and _HEX40 not in secret_free, secret_free
    joined = redact_cmdline(" ".join(argv))
    assert "hunter2" not in joined and _HEX40 not in joined, joined
    assert redact_cmdline(secret_free) == secret_free


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "train.py", "--tokenizer", "gpt2", "--bypass", "cache", "--compass", "n"],
        ["rsync", "-a", "--passfile", "/run/secrets/rsync", "src/", "dst/"],
        ["python", "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"],
        ["python", "-c", "d = {'sort_key': 'id'}; print(d['sort_key'])"],
        ["htpasswd", "-v", "users", "alice"],
        ["smbclient", "-L", "nas", "-N"],
        ["torchrun", "--nproc_per_node=8", "train.py", "--hotkey", "F5", "--monkey", "patch"],
        ["python", "train.py", "--multipass", "2", "--onepass"],
    ],
)
def test_what_the_new_classes_leave_alone(argv: list[str]) -> None:
    assert redact_argv(argv) == argv
    assert redact_cmdline(" ".join(argv)) == " ".join(argv)


@pytest.mark.parametrize(
    "token",
    [
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_" + "a1B2c3D4" * 5,
        "github_pat_11ABCDEFG0" + "x" * 40,
        "glpat-" + "Ab3dEf6hIj9kLm2nOp5q",
        "xoxb-1234567890-0987654321-" + "AbCdEfGhIjKlMnOpQrStUvWx",
        "sk-proj-" + "Zx9" * 16,
        "sk-ant-api03-" + "Qw8" * 20,
        "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123",
        "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08e4",
        "-----BEGIN RSA PRIVATE KEY-----MIIEpAIBAAKCAQEA-----END RSA PRIVATE KEY-----",
    ],
)
def test_values_shaped_like_keys_are_dropped_without_a_name(token: str) -> None:
    for line in (f"python serve.py {token} --port 80", f"python serve.py --x={token}"):
        out = redact_cmdline(line)
        assert token not in out and R in out, out
    if "/" not in token:  # inside a URL path, a base64 key with / reads as path components
        assert token not in redact_text(f"see https://h/{token}/x")


def test_urls_keep_the_user_and_drop_the_password_and_secret_parameters() -> None:
    url = "https://u:p@h/x?api_key=k&b=1&sig=Zm9v"
    assert redact_text(url) == f"https://u:{R}@h/x?api_key={R}&b=1&sig={R}"
    assert redact_text("postgres://pw:secret@db:5432/x") == f"postgres://pw:{R}@db:5432/x"


def test_names_words_and_references() -> None:
    for name in ("PGPASSWORD", "MYSQL_PWD", "--pw", "hfToken", "AWS_SECRET_ACCESS_KEY", "MY_KEY"):
        assert is_secret_name(name), name
    for name in ("PWD", "--max-tokens", "--tokenizer", "--pad-token", "--password-file"):
        assert not is_secret_name(name), name
    for name in ("--token-budget", "--num-key-value-heads", "--sort-key", "--bypass", "--pass-k"):
        assert not is_secret_name(name), name
    assert redact_argv(["x", "--num-key-value-heads", "8"]) == ["x", "--num-key-value-heads", "8"]
    assert redact_argv(["code-server", "--auth", "none"]) == ["code-server", "--auth", "none"]
    assert redact_environment_entry("DB_PASSWORD", "hunter2") == R
    assert redact_environment_entry("PWD", "/home/alice") == "/home/alice"
    assert redact_environment_entry("DATABASE_URL", "mysql://a:b@h/d") == f"mysql://a:{R}@h/d"


@pytest.mark.parametrize("name", ["benign-tuning", "benign-heldout"])
def test_realistic_gpu_command_lines_are_kept_whole(name: str) -> None:
    for line in _corpus(name):
        assert redact_cmdline(line) == line
        assert redact_argv(line.split(" ")) == line.split(" ")


# -- properties ------------------------------------------------------------------------------

_SECRET_ALPHABET = string.ascii_letters + string.digits + "!#$%()*+,-./:;<>?@[]^_{|}~"
_secrets = st.text(_SECRET_ALPHABET, min_size=8, max_size=40).filter(
    lambda s: not s.startswith("-") and s.lower() not in ("none", "null")
)
_url_secrets = st.text(string.ascii_letters + string.digits + "-._~!$*+,;=%", min_size=8)
_flags = st.sampled_from(
    [
        "--token", "--password", "--api-key", "--hf_token", "--secret", "-passwd", "--pw",
        "--db-password", "--NotebookApp.token", "--access-key", "--client_secret", "--auth",
        "--sas-token", "--jwt", "--passphrase", "--credentials", "--wandb-api-key",
    ]
)  # fmt: skip
_env_names = st.sampled_from(
    [
        "PGPASSWORD", "MYSQL_PWD", "OPENAI_API_KEY", "HF_TOKEN", "DB_PASSWORD", "CLIENT_SECRET",
        "MY_KEY", "App.token", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "REDIS_AUTH",
        "-Djavax.net.ssl.trustStorePassword", "spark.hadoop.fs.s3a.secret.key", "dbPassword",
    ]
)  # fmt: skip
_benign = st.sampled_from(
    [
        "python", "-m", "torch.distributed.run", "--nproc_per_node=8", "train.py", "--lr",
        "3e-4", "--model", "meta-llama/Llama-3.1-8B-Instruct", "/data/imagenet", "--bf16",
        "--max-tokens", "512", "--output_dir", "/ckpt/run_2024", "srun", "--gres=gpu:8",
        "--tokenizer", "gpt2", "--port", "8000", "~/.cache/huggingface", "--seed", "42",
        "vllm", "serve", "--tensor-parallel-size", "4", "accelerate", "launch", "--fp16",
        "Qwen/Qwen2.5-72B-Instruct-AWQ", "--num-key-value-heads", "8", "-x", "NCCL_DEBUG=INFO",
    ]
)  # fmt: skip


@st.composite
def _placed(draw: st.DrawFn, secret: str) -> list[str]:
    """``secret`` in one of the supported positions."""
    flag, env = draw(_flags), draw(_env_names)
    forms = [
        [flag, secret],
        [f"{flag}={secret}"],
        [f"{env}={secret}"],
        ["--config", '{"' + env + '": "' + secret.replace('"', "") + '"}'],
        ["-H", f"Authorization: Bearer {secret}"],
        ["-H", f"Cookie: {secret}"],
        ["curl", "-u", f"alice:{secret}"],
        ["mysql", f"-p{secret}"],
        ["sshpass", "-p", secret, "ssh", "host"],
        ["bash", "-c", f"{env}={secret.replace(' ', '')} run.sh"],
    ]
    return draw(st.sampled_from(forms))


@given(
    data=st.data(),
    secret=_secrets,
    before=st.lists(_benign, max_size=6),
    after=st.lists(_benign, max_size=6),
)
def test_a_secret_in_any_supported_position_never_survives(
    data: st.DataObject, secret: str, before: list[str], after: list[str]
) -> None:
    placed = data.draw(_placed(secret))
    argv = ["python", *before, *placed, *after]
    assume(secret not in " ".join(["python", *before, *after]))
    stored = " ".join(redact_argv(argv))
    assert secret not in stored, stored
    assert secret not in redact_cmdline(" ".join(argv))
    assert redact_cmdline(stored) == stored  # the store's pass changes nothing more


@given(user=st.text(string.ascii_lowercase, min_size=1, max_size=8), password=_url_secrets)
def test_url_passwords_never_survive(user: str, password: str) -> None:
    out = redact_text(f"--db=postgres://{user}:{password}@db.example:5432/x")
    assert f":{password}@" not in out
    assert out == f"--db=postgres://{user}:{R}@db.example:5432/x"


@given(argv=st.lists(st.one_of(_benign, _secrets, _flags, st.text(max_size=30)), max_size=12))
def test_redaction_is_idempotent(argv: list[str]) -> None:
    once = redact_argv(argv)
    assert redact_argv(once) == once
    line = " ".join(argv)
    assert redact_cmdline(redact_cmdline(line)) == redact_cmdline(line)


@given(argv=st.lists(_benign, min_size=1, max_size=20))
def test_benign_arguments_survive(argv: list[str]) -> None:
    assert redact_argv(argv) == argv
    assert redact_cmdline(" ".join(argv)) == " ".join(argv)


# -- every path into the store goes through it -----------------------------------------------


def test_the_store_redacts_every_process_record(tmp_path: Path) -> None:
    """An import, a scrape or anything else that builds a Process with a raw command line: the
    store's writer redacts the command line and the name before they are written."""
    path = tmp_path / "s.duckdb"
    store = Store(path)
    raw = "python train.py --token hunter2 PGPASSWORD=hunter2"
    record: Process = observed_process("n1", 7, 0.0, 1.0, comm=raw, cmdline=raw)
    store.add([record])
    store.flush()
    store.close()
    rows = query(path, "SELECT comm, cmdline FROM processes")
    assert rows == [(f"python train.py --token {R} PGPASSWORD={R}",) * 2]


def test_an_import_stores_process_names_redacted(tmp_path: Path) -> None:
    """nvidia-smi's process_name can be a whole command line (some drivers, some wrappers)."""
    apps = tmp_path / "apps.csv"
    apps.write_text(
        "timestamp, gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"
        "2025/07/27 00:26:46.428, GPU-aaaaaaaa-1111-2222-3333-444444444444, 4101, "
        "python train.py --hf-token hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123, 41000 MiB\n"
    )
    store = Store(tmp_path / "s.duckdb")
    try:
        import_files([apps], store, "n1", None)
    finally:
        store.close()
    rows = query(tmp_path / "s.duckdb", "SELECT comm, cmdline FROM processes")
    assert rows == [(f"python train.py --hf-token {R}",) * 2]
