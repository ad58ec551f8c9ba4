"""Reservations replayed on real demand: `python bench/reservations.py [--tenants N]`.

The reservation half of `bench/recommendations.py` (ServeGen's m-large service and its largest
tenants, with Azure LLM 2023's second-level bursts, fitted on week 1 and scored on week 2,
against peak and mean provisioning). See that script for the method.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from bench.recommendations import reservations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=20, help="largest ServeGen tenants")
    args = parser.parse_args()
    reservations(args.tenants)
    return 0


if __name__ == "__main__":
    sys.exit(main())
