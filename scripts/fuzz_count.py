#!/usr/bin/env python3
"""Sum the fuzz campaign's counts of cases (the JSON lines the test processes append to
$ATTNGEN_FUZZ_REPORT; tests/conftest.py) and print them, property by property.

    ATTNGEN_FUZZ=full ATTNGEN_FUZZ_REPORT=fuzz-count.jsonl bash scripts/test.sh tests/fuzz
    python3 scripts/fuzz_count.py fuzz-count.jsonl
"""

import collections
import json
import sys


def main(path: str) -> int:
    total = collections.Counter()
    with open(path) as f:
        for line in f:
            if line.strip():
                total.update(json.loads(line))
    width = max(map(len, total), default=0)
    for name, n in sorted(total.items()):
        print(f"{name:<{width}}  {n:>7}")
    print(f"{'all':<{width}}  {sum(total.values()):>7}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
