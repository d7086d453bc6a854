#!/usr/bin/python3
"""What the last ctest run in a build folder cost: its slowest tests and the time per label (the
tiers, then the areas), from Testing/Temporary/LastTest.log and the tests' labels. The test
scripts print it after every run (scripts/test.sh, scripts/test-sanitizers.sh), so that a change
that adds test time shows where.

    ctest_cost.py BUILD_DIR [--top 15]

Times are each test's own (summed over tests, as ctest's "sec*proc"); with -j2 the wall time is
about half.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys

TIERS = ("unit", "integration", "emulation", "mutation", "slow")


def list_tests(build):
    """The build's tests as `ctest --show-only=json-v1` lists them. That run rewrites
    Testing/Temporary's logs (an empty LastTest.log): they are put back as they were."""
    temporary = os.path.join(build, "Testing", "Temporary")
    saved = {}
    for name in ("LastTest.log", "LastTestsFailed.log"):
        path = os.path.join(temporary, name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                saved[path] = f.read()
    try:
        listing = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"],
                                 check=True, stdout=subprocess.PIPE, text=True).stdout
    finally:
        for path, data in saved.items():
            with open(path, "wb") as f:
                f.write(data)
    return json.loads(listing)["tests"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    log = os.path.join(args.build, "Testing", "Temporary", "LastTest.log")
    if not os.path.exists(log):
        print(f"ctest_cost: no {log}: no test ran")
        return 0
    with open(log, errors="replace") as f:
        text = f.read()
    # Each test's block: "N/M Testing: NAME" ... "Test time =   1.23 sec".
    times = {}
    for m in re.finditer(r"^\d+/\d+ Testing: (.+?)\n.*?^Test time =\s*([\d.]+) sec", text,
                         re.M | re.S):
        times[m.group(1).strip()] = float(m.group(2))
    labels = {}
    for test in list_tests(args.build):
        labels[test["name"]] = next(
            (p["value"] for p in test.get("properties", []) if p["name"] == "LABELS"), [])
    per_label = collections.defaultdict(lambda: [0.0, 0])
    for name, seconds in times.items():
        for label in labels.get(name, ["(no label)"]):
            per_label[label][0] += seconds
            per_label[label][1] += 1
    total = sum(times.values())
    print(f"\nTest cost: {len(times)} tests, {total:.0f} s of test time "
          f"(summed; the slowest {args.top}, then each label)")
    for name, seconds in sorted(times.items(), key=lambda kv: -kv[1])[:args.top]:
        tier = next((t for t in TIERS if t in labels.get(name, [])), "?")
        print(f"  {seconds:8.2f} s  {tier:<11} {name[:100]}")
    order = [t for t in TIERS if t in per_label] + sorted(set(per_label) - set(TIERS))
    for label in order:
        seconds, count = per_label[label]
        print(f"  {label:<12} {seconds:8.1f} s  {count:4d} tests"
              f"{'  (tier)' if label in TIERS else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
