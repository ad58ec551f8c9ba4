"""Reading a ``--config`` TOML file for the analyzer's tables (``[thresholds]``, ``[owners]``,
``[prices]``, ``[site]``): one reader, one set of one-line errors that name the file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from analyzer.load import InputError


def read(path: Path) -> dict[str, Any]:
    """The whole file as TOML; a file that cannot be read or parsed is bad input."""
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"--config {path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(f"--config {path}: not a text file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"--config {path}: not valid TOML ({exc})") from None


def table(path: Path, name: str) -> dict[str, Any]:
    """The file's ``[name]`` table (empty when absent); a non-table ``name`` is bad input."""
    value = read(path).get(name, {})
    if not isinstance(value, dict):
        raise InputError(f"--config {path}: [{name}] must be a table")
    return value
