"""``aiscope agent run`` once its flags are parsed: the long-running agent, without the CLI.

Why: the command-line layer (Typer, Click, Rich, and the pydantic that Typer validates options
with) costs about 9 MiB of RSS, which a per-node agent would carry for its whole life after using
it once. So ``aiscope agent run``, run as the program, parses and validates its flags and its
configuration, then replaces itself (:func:`os.execv`: the same pid, stdio, cgroup and signal
disposition, so systemd and Kubernetes see no difference) with ``python -m aiscope.agentd``,
which imports only the agent's half. Callers of :func:`aiscope.cli.main` in-process (tests, a
Python embedding) run the agent in place instead.

The parsed command travels in ``AISCOPE_AGENTD_SPEC`` (JSON); the original arguments follow
``-m aiscope.agentd`` only so ``ps`` still shows what was asked for. Errors after the exec are
reported as the CLI reports them: one ``aiscope:`` line and the error's exit code.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from store.errors import AiscopeError

ENV = "AISCOPE_AGENTD_SPEC"


@dataclasses.dataclass(frozen=True, slots=True)
class RunSpec:
    """Everything ``aiscope agent run`` was asked for, before defaults and the environment."""

    flags: dict[str, Any]
    config_file: Path | None = None
    virtual_gpus: int | None = None
    virtual_model: str = "H100-80GB"
    simulate: str | None = None
    node: str | None = None
    debug: bool = False

    def to_json(self) -> str:
        return json.dumps(
            {
                "flags": {k: _encode(v) for k, v in self.flags.items()},
                "config_file": _encode(self.config_file),
                "virtual_gpus": self.virtual_gpus,
                "virtual_model": self.virtual_model,
                "simulate": self.simulate,
                "node": self.node,
                "debug": self.debug,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        raw = json.loads(text)
        return cls(
            flags={k: _decode(v) for k, v in raw["flags"].items()},
            config_file=_decode(raw["config_file"]),
            virtual_gpus=raw["virtual_gpus"],
            virtual_model=raw["virtual_model"],
            simulate=raw["simulate"],
            node=raw["node"],
            debug=raw["debug"],
        )


def _encode(value: Any) -> Any:
    return {"path": str(value)} if isinstance(value, Path) else value


def _decode(value: Any) -> Any:
    return Path(value["path"]) if isinstance(value, dict) and "path" in value else value


def run(spec: RunSpec) -> int:
    """Configure, compose and run the agent until it is stopped; its exit code."""
    from agent import service  # noqa: PLC0415
    from agent.config import load_config  # noqa: PLC0415
    from aiscope.compose import build_agent  # noqa: PLC0415
    from analyzer.thresholds import from_file  # noqa: PLC0415

    cfg = load_config(spec.flags, config_file=spec.config_file)
    built = build_agent(
        cfg,
        virtual_gpus=spec.virtual_gpus,
        virtual_model=spec.virtual_model,
        simulate=spec.simulate,
        sim_node=spec.node,
        thresholds=from_file(cfg.config_file),
    )
    return service.run(built)


def exec_lean(spec: RunSpec, shown_args: list[str]) -> NoReturn:
    """Replace this process with ``python -m aiscope.agentd`` running ``spec``."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ[ENV] = spec.to_json()
    os.execv(sys.executable, [sys.executable, "-m", "aiscope.agentd", *shown_args])


def main() -> int:
    """The exec'd agent: the spec from the environment, errors as the CLI reports them."""
    raw = os.environ.pop(ENV, None)
    if raw is None:
        print(
            "aiscope: aiscope.agentd is started by 'aiscope agent run'; run that", file=sys.stderr
        )
        return 2
    spec = RunSpec.from_json(raw)
    logging.basicConfig(
        level=logging.DEBUG if spec.debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return run(spec)
    except AiscopeError as exc:
        if spec.debug:
            raise
        print(f"aiscope: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("aiscope: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
