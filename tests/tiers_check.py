#!/usr/bin/python3
"""Every ctest test carries exactly one tier label (tests/README.md): unit, integration,
emulation, mutation or slow. A test without one would run in no tier's command (the quick
`ctest --preset unit` of the edit loop, the sanitizer legs' `-L unit|emulation`), and one with
two would run twice.

    tiers_check.py BUILD_DIR

Run by scripts/test.sh after the suite (not as a test of it: listing the tests from inside a
ctest run would rewrite that run's log).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ctest_cost import list_tests  # noqa: E402

TIERS = {"unit", "integration", "emulation", "mutation", "slow"}


def main():
    bad = []
    tests = list_tests(sys.argv[1])
    for test in tests:
        labels = next((p["value"] for p in test.get("properties", []) if p["name"] == "LABELS"),
                      [])
        tiers = sorted(TIERS.intersection(labels))
        if len(tiers) != 1:
            bad.append(f"{test['name']}: tiers {tiers or 'none'} (labels {labels})")
    for line in bad:
        print(line)
    print(f"{len(tests)} tests, {len(bad)} without exactly one tier of {sorted(TIERS)}")
    return 1 if bad or not tests else 0


if __name__ == "__main__":
    sys.exit(main())
