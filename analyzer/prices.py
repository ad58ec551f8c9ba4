"""Who owns what, and what a GPU-hour costs: the ``[owners]`` and ``[prices]`` config tables.

Read from the same TOML file as ``[thresholds]`` (``aiscope analyze --config FILE``)::

    [owners.teams]                 # a team is any user, namespace or account it names
    vision = ["user:alice", "namespace:cv-*", "account:cv"]
    llm = ["account:llm-*", "user:bob"]

    [owners.accounts]              # Slurm accounts by user (the store does not keep a job's
    cv = ["alice", "carol"]        # account); `sacctmgr -nP show assoc format=account,user`
    llm-pretrain = ["bob"]

    [prices]
    currency = "USD"
    gpu_hour = 2.00                # every GPU model not listed below
    kwh = 0.15                     # optional: measured energy, per kWh

    [prices.models]                # per GPU-hour, matched against the device name
    "H100" = 4.00                  # a word matches anywhere in the name (case-insensitive)
    "*A100*80GB*" = 2.50           # a glob matches the whole name

Patterns are shell globs (``*``, ``?``, ``[...]``), matched case-sensitively for owners and
case-insensitively for GPU models. The first matching team, and the first matching model, in
file order wins. Every mistake is a one-line :class:`~analyzer.load.InputError` (exit 2) naming
the file and the key.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer import configfile
from analyzer.load import InputError

#: What a team rule may name: ``KIND:PATTERN``.
RULE_KINDS = ("user", "namespace", "account")
_GLOB = re.compile(r"[*?\[]")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]*$")
_PATTERN = re.compile(r"^[^\s:]+$")


@dataclass(frozen=True, slots=True)
class Rule:
    """``user:alice``, ``namespace:cv-*`` or ``account:cv``."""

    kind: str
    pattern: str

    def matches(self, attrs: Mapping[str, str | None]) -> bool:
        value = attrs.get(self.kind)
        return value is not None and fnmatch.fnmatchcase(value, self.pattern)

    def __str__(self) -> str:
        return f"{self.kind}:{self.pattern}"


@dataclass(frozen=True, slots=True)
class Group:
    """A named set of rules: a team (rules of any kind) or an account (user patterns)."""

    name: str
    rules: tuple[Rule, ...]

    def matches(self, attrs: Mapping[str, str | None]) -> bool:
        return any(r.matches(attrs) for r in self.rules)


@dataclass(frozen=True, slots=True)
class ModelPrice:
    pattern: str
    gpu_hour: float

    def matches(self, model: str) -> bool:
        name, pattern = model.lower(), self.pattern.lower()
        if _GLOB.search(pattern):
            return fnmatch.fnmatchcase(name, pattern)
        return pattern in name


@dataclass(frozen=True, slots=True)
class Prices:
    """A price per GPU-hour per GPU model (first match), a default, and optionally per kWh."""

    currency: str = "USD"
    gpu_hour: float | None = None
    models: tuple[ModelPrice, ...] = ()
    kwh: float | None = None
    where: str = "prices"

    def per_gpu_hour(self, model: str | None) -> float:
        """The price of one GPU-hour of ``model``. Raises :class:`InputError` when neither a
        model pattern nor the default prices it (the bill would not add up)."""
        for m in self.models:
            if model is not None and m.matches(model):
                return m.gpu_hour
        if self.gpu_hour is None:
            raise InputError(
                f"{self.where}: no price for GPU model {model or '(unknown)'!r}; add it under "
                "[prices.models] or set prices.gpu_hour as the default"
            )
        return self.gpu_hour

    def matched(self, model: str | None) -> str:
        """Which setting priced ``model``: the pattern, or ``gpu_hour`` (the default)."""
        for m in self.models:
            if model is not None and m.matches(model):
                return f"models.{m.pattern}"
        return "gpu_hour"


@dataclass(frozen=True, slots=True)
class Accounting:
    """Teams, Slurm accounts by user, and prices (``None``: GPU-hours only, ``cost`` null)."""

    teams: tuple[Group, ...] = ()
    accounts: tuple[Group, ...] = ()
    prices: Prices | None = None

    def account_of(self, user: str | None) -> str | None:
        if user is None:
            return None
        return next((a.name for a in self.accounts if a.matches({"user": user})), None)

    def team_of(self, attrs: Mapping[str, str | None]) -> str | None:
        return next((t.name for t in self.teams if t.matches(attrs)), None)


def from_file(path: Path | None) -> Accounting:
    """The ``[owners]`` and ``[prices]`` tables of a TOML config file (empty when ``None``)."""
    if path is None:
        return Accounting()
    return from_mapping(configfile.read(path), where=str(path))


def from_mapping(data: Mapping[str, Any], where: str = "config") -> Accounting:
    """Validate the ``owners`` and ``prices`` tables of a parsed config."""
    owners = _table(data, "owners", where)
    _known(owners, ("teams", "accounts"), f"{where}: owners")
    teams = tuple(
        Group(name, _team_rules(rules, f"{where}: owners.teams.{name}"))
        for name, rules in _named(owners, "teams", where).items()
    )
    accounts = tuple(
        Group(name, _account_rules(users, f"{where}: owners.accounts.{name}"))
        for name, users in _named(owners, "accounts", where).items()
    )
    prices = _prices(data, where) if "prices" in data else None
    return Accounting(teams, accounts, prices)


def _table(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise InputError(f"{where}: {key} must be a table, like [{key}]")
    return value


def _known(table: Mapping[str, Any], keys: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in keys:
            raise InputError(f"{where}.{key}: unknown key (known: {', '.join(keys)})")


def _named(owners: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    table = _table(owners, key, f"{where}: owners")
    for name in table:
        if not _NAME.match(name):
            raise InputError(
                f"{where}: owners.{key}.{name!r}: a name is letters, digits and ._@+- "
                "(starting with a letter or digit)"
            )
    return dict(table)


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise InputError(f'{where}: expected a non-empty list of strings, like ["user:alice"]')
    return value


def _team_rules(value: Any, where: str) -> tuple[Rule, ...]:
    rules = []
    for i, text in enumerate(_strings(value, where)):
        kind, sep, pattern = text.partition(":")
        if not sep or kind not in RULE_KINDS or not _PATTERN.match(pattern):
            raise InputError(
                f"{where}[{i}]: {text!r} is not KIND:PATTERN with KIND one of "
                f'{", ".join(RULE_KINDS)} (e.g. "user:alice", "namespace:cv-*")'
            )
        rules.append(Rule(kind, pattern))
    return tuple(rules)


def _account_rules(value: Any, where: str) -> tuple[Rule, ...]:
    rules = []
    for i, text in enumerate(_strings(value, where)):
        pattern = text.removeprefix("user:")
        if not _PATTERN.match(pattern):
            raise InputError(f'{where}[{i}]: {text!r} is not a user name or pattern ("alice")')
        rules.append(Rule("user", pattern))
    return tuple(rules)


def _price(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{where}: must be a finite number, at least 0, got {value}")
    return float(value)


def _prices(data: Mapping[str, Any], where: str) -> Prices:
    table = _table(data, "prices", where)
    _known(table, ("currency", "gpu_hour", "kwh", "models"), f"{where}: prices")
    currency = table.get("currency", "USD")
    if not isinstance(currency, str) or not currency.strip():
        raise InputError(f'{where}: prices.currency: expected a currency code like "USD"')
    models = tuple(
        ModelPrice(_model_pattern(p, where), _price(v, f"{where}: prices.models.{p!r}"))
        for p, v in _table(table, "models", f"{where}: prices").items()
    )
    default = table.get("gpu_hour")
    if default is None and not models:
        raise InputError(f"{where}: prices: set gpu_hour (a price per GPU-hour) or [prices.models]")
    return Prices(
        currency=currency.strip(),
        gpu_hour=None if default is None else _price(default, f"{where}: prices.gpu_hour"),
        models=models,
        kwh=None if "kwh" not in table else _price(table["kwh"], f"{where}: prices.kwh"),
        where=f"{where}: prices",
    )


def _model_pattern(pattern: str, where: str) -> str:
    if not pattern.strip():
        raise InputError(f"{where}: prices.models: an empty GPU model pattern")
    return pattern.strip()
