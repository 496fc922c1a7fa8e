"""``python -m bench [--quick] [--scenario NAME ...] [--repeat K]``: run the benchmark scenarios,
write ``bench/results/latest.json``, ``latest.md`` and plots, and print the table."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from bench.harness import finish, run_cases
from bench.scenarios import ALIASES, SCENARIOS, Mode, plan

RESULTS = Path(__file__).resolve().parent / "results"
# Seconds. A repetition starts only if its usual duration fits in what is left, and each is capped,
# so the margins cover one that runs long: the full run stays within 15 minutes, the quick one 3.
FULL_BUDGET = 840.0
QUICK_BUDGET = 145.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small N, short runs (under 3 minutes)")
    parser.add_argument(
        "--scenario",
        action="extend",
        nargs="+",
        choices=[*SCENARIOS, *ALIASES],
        metavar="NAME",
        help=f"run only these scenarios ({', '.join(SCENARIOS)}); default: all",
    )
    parser.add_argument("--repeat", type=int, help="repetitions of every case (default 3; 1 for the longest)")
    parser.add_argument("--budget", type=float, help="seconds the whole run may take")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where latest.json/md and plots go")
    args = parser.parse_args(argv)
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be at least 1")
    started = datetime.now(UTC)
    cases = plan(Mode(quick=args.quick, repeat=args.repeat), args.scenario)
    budget = args.budget if args.budget is not None else (QUICK_BUDGET if args.quick else FULL_BUDGET)
    outcome = run_cases(cases, budget)
    finish(outcome, args.quick, started, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
