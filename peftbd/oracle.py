"""Draft-cost oracle CLI: `python -m peftbd.oracle --t0 S --draft-share RHO --accepted TAU
--targets TPS [TPS ...]` prints the oracle as JSON, then as a table.

A target is `TPS` or `NAME=TPS` (e.g. `fastmtp=188.01 ar=431.36`); bare values are named by
their number.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from peftbd.cost_model import draft_cost_oracle, oracle_table


def _target(text: str) -> tuple[str, float]:
    name, sep, value = text.rpartition("=")
    try:
        tps = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--targets value {text!r} is not TPS or NAME=TPS (e.g. 188.01 or fastmtp=188.01)"
        ) from None
    return (name if sep else value), tps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m peftbd.oracle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--t0", type=float, required=True, help="measured seconds per speculative round (T0)")
    parser.add_argument("--draft-share", type=float, required=True, help="draft share of the round time (rho)")
    parser.add_argument("--accepted", type=float, required=True,
                        help="accepted tokens per round, bonus included (tau)")
    parser.add_argument("--targets", type=_target, nargs="*", default=[], metavar="TPS",
                        help="throughputs to match (tokens/s), as TPS or NAME=TPS")
    args = parser.parse_args(argv)
    try:
        oracle = draft_cost_oracle(args.t0, args.draft_share, args.accepted, dict(args.targets))
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(oracle, indent=2))
    print()
    print(oracle_table(oracle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
