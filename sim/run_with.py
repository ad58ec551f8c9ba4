"""Run any NVML tool on one node of a scenario: ``python -m sim.run_with SCENARIO
[--node NAME] -- MODULE [ARGS...]``.

It installs the virtual driver as ``pynvml``'s library in this process, then runs the tool's
module (``gpustat``, ``nvitop``, ...) unmodified, as ``python -m MODULE ARGS`` would::

    python -m sim.run_with demo --node gpu-node-03 -- gpustat --json
"""

from __future__ import annotations

import argparse
import runpy
import sys

from agent.nvml import install_library
from sim.engine import LiveNode


def main(argv: list[str]) -> None:
    if "--" not in argv:
        raise SystemExit(
            "usage: python -m sim.run_with SCENARIO [--node NAME] [--at-hours H] -- MODULE"
        )
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m sim.run_with")
    parser.add_argument("scenario")
    parser.add_argument("--node")
    parser.add_argument("--at-hours", type=float, default=0.0, help="scenario time to start at")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1 :]
    if not command:
        raise SystemExit("no module to run after --")
    live = LiveNode.start(args.scenario, args.node, args.at_hours)
    install_library(live.library)
    sys.argv = command
    runpy.run_module(command[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
