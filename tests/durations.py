"""Refresh tests/durations.json, the seconds each test file took, from the log of a run with --durations=0:

    PYTEST_ADDOPTS=--durations=0 make test > test.log; python tests/durations.py test.log

tests/conftest.py hands the files out longest first, so neither xdist worker is left with a long file at the end."""

import collections
import json
import re
import sys
from pathlib import Path

PATH = Path(__file__).with_name("durations.json")


def per_file(log: str) -> dict[str, float]:
    seconds = collections.Counter()
    for value, node in re.findall(r"^([\d.]+)s (?:setup|call|teardown)\s+(\S+)", log, re.M):
        seconds[node.split("::")[0]] += float(value)
    return {name: round(value, 1) for name, value in sorted(seconds.items()) if value >= 1.0}


if __name__ == "__main__":
    found = per_file(Path(sys.argv[1]).read_text())
    if not found:
        sys.exit(f"no --durations=0 table in {sys.argv[1]}")
    PATH.write_text(json.dumps(found, indent=1) + "\n")
    print(f"{PATH}: {len(found)} files, {sum(found.values()):.0f} s")
