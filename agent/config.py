"""Agent configuration: CLI flags, then ``AISCOPE_*`` environment variables, then a TOML file.

Every key has one typed parser. A bad value raises :class:`ConfigError` with a one-line message
that names the key and where it came from (``--interval``, ``AISCOPE_INTERVAL`` or
``config.toml: agent.interval``); the CLI turns it into exit code 2.

The TOML file (``--config`` or ``AISCOPE_CONFIG``) holds an ``[agent]`` table with the same keys::

    [agent]
    store = "/var/lib/aiscope"
    listen = "0.0.0.0:9835"
    interval = 1.0
    raw_retention_days = 14
"""

from __future__ import annotations

import math
import os
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from store.errors import BadInput

DEFAULT_LISTEN = "127.0.0.1:9835"
STORE_FILE_NAME = "aiscope.duckdb"


class ConfigError(BadInput, ValueError):
    """A configuration value is invalid; the message names the key and the problem."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything the agent needs to run, validated. Durations in seconds."""

    store: Path
    listen_host: str
    listen_port: int
    node: str
    interval: float = 1.0
    process_interval: float = 5.0
    flush_interval: float = 10.0
    rollup_interval: float = 300.0
    prune_interval: float = 3600.0
    dcgm_compat: bool = False
    #: Export the ``user`` and ``comm`` labels of per-process series (off: the labels are
    #: dropped from /metrics; the store keeps them). Off in the DaemonSet (docs/security.md).
    identity_labels: bool = True
    #: The Kubernetes API server for pod names; "" means in-cluster when running in a pod.
    kubernetes_api: str = ""
    analysis_interval: float = 600.0
    analysis_window: float = 10800.0
    buffer_rows: int = 100_000
    raw_retention_days: float = 14.0
    rollup_retention_days: float = 400.0
    nvml_deadline: float = 2.0
    duration: float | None = None
    config_file: Path | None = None  # where the file settings came from (for [thresholds])
    #: A fleet LOCATION to publish closed intervals to ("" = do not publish), how often, and
    #: the length of one segment (a divisor of a day).
    publish: str = ""
    publish_interval: float = 300.0
    publish_segment: float = 3600.0


def default_store() -> Path:
    """``$AISCOPE_STORE``, else the per-user data directory (``$XDG_DATA_HOME/aiscope``)."""
    env = os.environ.get("AISCOPE_STORE")
    if env:
        return resolve_store(Path(env))
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "aiscope" / STORE_FILE_NAME


def resolve_store(path: Path) -> Path:
    """A store is a DuckDB file; a directory means ``<dir>/aiscope.duckdb``."""
    return path / STORE_FILE_NAME if path.is_dir() else path


def _positive_float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("expected a positive number") from None
    if not (math.isfinite(number) and number > 0):
        raise ValueError("expected a positive number")
    return number


def _positive_int(value: Any) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("expected a positive whole number") from None
    if not (math.isfinite(number) and number.is_integer() and number > 0):
        raise ValueError("expected a positive whole number")
    return int(number)


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT``. The host must be explicit (no bare ``:9835``)."""
    text = str(value).strip()
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT such as {DEFAULT_LISTEN}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be 0-65535, not {port!r}")
    return host, int(port)


def _text(value: Any) -> str:
    """A text setting: a flag, a variable or a TOML string (``to = 3`` is refused, not read as
    the directory ``3``)."""
    if not isinstance(value, str | Path):
        raise ValueError("expected a string")
    return str(value)


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "interval": _positive_float,
    "process_interval": _positive_float,
    "flush_interval": _positive_float,
    "rollup_interval": _positive_float,
    "prune_interval": _positive_float,
    "dcgm_compat": _boolean,
    "identity_labels": _boolean,
    "kubernetes_api": lambda v: _text(v).strip(),
    "analysis_interval": _positive_float,
    "analysis_window": _positive_float,
    "buffer_rows": _positive_int,
    "raw_retention_days": _positive_float,
    "rollup_retention_days": _positive_float,
    "nvml_deadline": _positive_float,
    "duration": _positive_float,
    "node": lambda v: _nonempty(_text(v)),
    "store": lambda v: resolve_store(Path(_text(v)).expanduser()),
    "listen": lambda v: parse_listen(_text(v)),
    "publish": lambda v: _location(_text(v)),
    "publish_interval": _positive_float,
    "publish_segment": lambda v: _segment(_positive_float(v)),
}
KEYS = tuple(_PARSERS)
#: ``[publish]`` keys and the agent keys they stand for.
PUBLISH_KEYS = {
    "to": "publish",
    "location": "publish",
    "interval": "publish_interval",
    "segment": "publish_segment",
}


def _location(text: str) -> str:
    """A LOCATION, checked (:func:`store.location.parse`) and kept as the user wrote it."""
    from store.location import BadLocation, parse  # noqa: PLC0415

    try:
        parse(text)
    except BadLocation as exc:
        raise ValueError(str(exc).removeprefix("--to ").removeprefix("--to: ")) from None
    return text.strip()


def _segment(seconds: float) -> float:
    if not (1 <= seconds <= 86400 and (86400 / seconds).is_integer()):
        raise ValueError("a segment must divide a day into whole seconds (300, 3600, ...)")
    return seconds


def _nonempty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


#: The tables a config file may hold; any other is a misspelling, refused with the file named.
TABLES = ("agent", "thresholds", "owners", "prices", "site", "notify", "publish")


def read_config_file(path: Path) -> dict[str, Any]:
    """A config file's tables, each checked to be one aiscope knows (``[agentt]`` is refused,
    not silently ignored). Raises :class:`ConfigError`."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (a TOML config expected)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    unknown = sorted(set(data) - set(TABLES))
    if unknown:
        raise ConfigError(
            f"{path}: unknown table [{unknown[0]}] (known: {', '.join(TABLES)}); check its spelling"
        )
    return data


def read_toml(path: Path) -> dict[str, Any]:
    """The ``[agent]`` table of a TOML file. Raises :class:`ConfigError`."""
    data = read_config_file(path)
    table = data.get("agent", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [agent] must be a table")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key agent.{unknown[0]} (known: {', '.join(KEYS)})")
    return {**_publish_table(path, data.get("publish", {})), **table}


def _publish_table(path: Path, table: Any) -> dict[str, Any]:
    """``[publish] to = "s3://…", interval = 300, segment = 3600`` as agent keys (the
    ``[agent]`` table's ``publish*`` keys win)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [publish] must be a table")
    unknown = sorted(set(table) - set(PUBLISH_KEYS))
    if unknown:
        raise ConfigError(
            f"{path}: unknown key publish.{unknown[0]} (known: {', '.join(PUBLISH_KEYS)})"
        )
    return {PUBLISH_KEYS[k]: v for k, v in table.items()}


def load_config(
    flags: Mapping[str, Any],
    env: Mapping[str, str] = os.environ,
    config_file: Path | None = None,
) -> AgentConfig:
    """Merge flags over ``AISCOPE_*`` over the TOML file over defaults, and validate."""
    file_path = config_file or (Path(env["AISCOPE_CONFIG"]) if env.get("AISCOPE_CONFIG") else None)
    table = read_toml(file_path) if file_path else {}
    values: dict[str, Any] = {}
    for key in KEYS:
        raw, source = _pick(key, flags, env, table, file_path)
        if raw is None:
            continue
        try:
            values[key] = _PARSERS[key](raw)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{source}: {exc} (got {raw!r})") from None
    host, port = values.pop("listen", parse_listen(DEFAULT_LISTEN))
    values.setdefault("store", default_store())
    values.setdefault("node", socket.gethostname())
    known = {f.name for f in fields(AgentConfig)}
    return AgentConfig(
        listen_host=host,
        listen_port=port,
        config_file=file_path,
        **{k: v for k, v in values.items() if k in known},
    )


def _pick(
    key: str,
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    table: Mapping[str, Any],
    file_path: Path | None,
) -> tuple[Any, str]:
    if flags.get(key) is not None:
        return flags[key], f"--{key.replace('_', '-')}"
    env_key = f"AISCOPE_{key.upper()}"
    if env.get(env_key):
        return env[env_key], env_key
    if key in table:
        return table[key], f"{file_path}: agent.{key}"
    return None, key
