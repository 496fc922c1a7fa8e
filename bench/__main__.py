"""``python -m bench [--quick]``: run every benchmark scenario and print its figures."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    print("no benchmark scenarios yet")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
