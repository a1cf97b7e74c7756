#!/usr/bin/env python3
"""Prints the slowest tests of the last ctest run and the run's total test time, from
Testing/Temporary/LastTest.log under the build directory (test.sh calls it at the end, so that a suite
creeping towards CI's limit shows where).

    scripts/slowest_tests.py BUILD_DIR [--top N]
"""
import argparse
import pathlib
import re
import sys


def test_times(log_text):
    """(name, seconds) for each test in the log, in run order."""
    for section in re.split(r"^\d+/\d+ Testing: ", log_text, flags=re.M)[1:]:
        name = section.split("\n", 1)[0].strip()
        m = re.search(r"^Test time =\s*([0-9.]+) sec", section, flags=re.M)
        if m:
            yield name, float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build_dir")
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    log = pathlib.Path(a.build_dir) / "Testing" / "Temporary" / "LastTest.log"
    if not log.exists():
        print(f"slowest_tests: {log} not found", file=sys.stderr)
        return 0
    times = list(test_times(log.read_text(errors="replace")))
    total = sum(t for _, t in times)
    print(f"\nThe {min(a.top, len(times))} slowest of {len(times)} tests ({total:.0f} s of tests in all):")
    print(f"  {'seconds':>8}  {'share':>6}  test")
    for name, t in sorted(times, key=lambda x: -x[1])[:a.top]:
        print(f"  {t:8.1f}  {100 * t / max(total, 1e-9):5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
