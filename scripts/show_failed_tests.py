#!/usr/bin/env python3
"""Reads the last ctest run's log (Testing/Temporary/LastTest.log under the build directory) and prints,
at the end of a long log where CI's tail still shows it, either the output of the tests that failed
(each cut to its last --lines lines) or, with --slowest N, the N slowest tests and the run's total test
time (so that a suite creeping towards CI's limit shows where).

    scripts/show_failed_tests.py BUILD_DIR [--lines N]
    scripts/show_failed_tests.py BUILD_DIR --slowest N
"""
import argparse
import pathlib
import re
import sys


def test_sections(log_text):
    """(name, section text) for each test in the log, in run order."""
    for section in re.split(r"^\d+/\d+ Testing: ", log_text, flags=re.M)[1:]:
        yield section.split("\n", 1)[0].strip(), section


def failed_outputs(log_text):
    """(name, output lines) for each test the log marks 'Test Failed.'."""
    for name, section in test_sections(log_text):
        if not re.search(r"^Test Failed\.", section, flags=re.M):  # ctest writes it for timeouts too
            continue
        body = section.split("Output:\n", 1)[-1]
        body = body.split("<end of output>", 1)[0]
        lines = body.splitlines()
        if lines and set(lines[0]) == {"-"}:
            lines = lines[1:]
        yield name, lines


def test_times(log_text):
    """(name, seconds) for each test with a recorded time."""
    for name, section in test_sections(log_text):
        m = re.search(r"^Test time =\s*([0-9.]+) sec", section, flags=re.M)
        if m:
            yield name, float(m.group(1))


def print_slowest(log_text, top):
    times = list(test_times(log_text))
    total = sum(t for _, t in times)
    print(f"\nThe {min(top, len(times))} slowest of {len(times)} tests ({total:.0f} s of tests in all):")
    print(f"  {'seconds':>8}  {'share':>6}  test")
    for name, t in sorted(times, key=lambda x: -x[1])[:top]:
        print(f"  {t:8.1f}  {100 * t / max(total, 1e-9):5.1f}%  {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build_dir")
    ap.add_argument("--lines", type=int, default=150)
    ap.add_argument("--slowest", type=int, default=0, metavar="N")
    a = ap.parse_args()
    log = pathlib.Path(a.build_dir) / "Testing" / "Temporary" / "LastTest.log"
    if not log.exists():
        print(f"show_failed_tests: {log} not found", file=sys.stderr)
        return 0
    text = log.read_text(errors="replace")
    if a.slowest > 0:
        print_slowest(text, a.slowest)
        return 0
    for name, lines in failed_outputs(text):
        shown = lines[-a.lines:]
        print(f"\n===== failed: {name} (last {len(shown)} of {len(lines)} output lines) =====")
        print("\n".join(shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
