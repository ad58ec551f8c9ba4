"""Configuration precedence and one-line errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import ConfigError, load_config, parse_listen


def test_flags_beat_environment_beat_file(tmp_path: Path) -> None:
    toml = tmp_path / "agent.toml"
    toml.write_text('[agent]\ninterval = 3\nflush_interval = 30\nnode = "from-file"\n')
    env = {"AISCOPE_INTERVAL": "2", "AISCOPE_LISTEN": "[::1]:9100"}
    cfg = load_config({"interval": 0.5}, env=env, config_file=toml)
    assert cfg.interval == 0.5
    assert (cfg.listen_host, cfg.listen_port) == ("::1", 9100)
    assert cfg.flush_interval == 30.0
    assert cfg.node == "from-file"
    assert cfg.raw_retention_days == 14.0 and cfg.rollup_retention_days == 400.0


def test_defaults_listen_on_loopback_only() -> None:
    cfg = load_config({}, env={})
    assert (cfg.listen_host, cfg.listen_port) == ("127.0.0.1", 9835)
    assert cfg.store.name == "aiscope.duckdb"


def test_a_store_directory_means_the_file_inside(tmp_path: Path) -> None:
    cfg = load_config({"store": tmp_path}, env={})
    assert cfg.store == tmp_path / "aiscope.duckdb"


@pytest.mark.parametrize(
    ("flags", "env", "needle"),
    [
        ({"interval": -1}, {}, "--interval: expected a positive number"),
        ({}, {"AISCOPE_FLUSH_INTERVAL": "soon"}, "AISCOPE_FLUSH_INTERVAL"),
        ({"listen": ":9835"}, {}, "--listen: expected HOST:PORT"),
        ({"listen": "127.0.0.1:99999"}, {}, "port must be 0-65535"),
        ({}, {"AISCOPE_BUFFER_ROWS": "1.5"}, "AISCOPE_BUFFER_ROWS: expected a positive whole"),
        ({"node": "  "}, {}, "--node: must not be empty"),
    ],
)
def test_bad_values_name_the_key(flags, env, needle) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(flags, env=env)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_file_keys_and_syntax(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent]\nintervall = 1\n")
    with pytest.raises(ConfigError, match=r"unknown key agent\.intervall"):
        load_config({}, env={}, config_file=bad)
    bad.write_text("[agent\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config({}, env={}, config_file=bad)
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config({}, env={"AISCOPE_CONFIG": str(tmp_path / "missing.toml")})
    bad.write_text("[agent]\ninterval = 0\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: agent\.interval"):
        load_config({}, env={}, config_file=bad)


def test_parse_listen_ipv6_and_wildcard() -> None:
    assert parse_listen("0.0.0.0:9835") == ("0.0.0.0", 9835)
    assert parse_listen("[::]:9835") == ("::", 9835)
