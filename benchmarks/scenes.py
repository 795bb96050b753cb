"""How many scenes per second does vitcli.scenes draw (the issue asks for at least 200 on one core)?

Draws `--count` scenes of each kind (series 0), `--repeats` times, and prints the median rate per kind. Asserts
nothing.

    .venv/bin/python benchmarks/scenes.py
    .venv/bin/python benchmarks/scenes.py --count 500 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

from vitcli.scenes import KINDS, scenes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    for kind in KINDS:
        rates = []
        for _ in range(arguments.repeats):
            started = time.perf_counter()
            for _scene in scenes(0, arguments.count, kind):
                pass
            rates.append(arguments.count / (time.perf_counter() - started))
        print(
            f"{kind:>7}: {statistics.median(rates):6.0f} scenes/s (median of {arguments.repeats} x {arguments.count})"
        )


if __name__ == "__main__":
    main()
