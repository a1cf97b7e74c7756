#!/usr/bin/env python3
"""Prints, once more, the output of the tests that failed in the last ctest run, so that it sits at
the end of a long log (CI keeps only the tail). Reads Testing/Temporary/LastTest.log under the build
directory; each failed test's output is cut to its last --lines lines.

    scripts/show_failed_tests.py BUILD_DIR [--lines N]
"""
import argparse
import pathlib
import re
import sys


def failed_outputs(log_text):
    """(name, output lines) for each test the log marks 'Test Failed.'."""
    sections = re.split(r"^\d+/\d+ Testing: ", log_text, flags=re.M)[1:]
    for section in sections:
        name = section.split("\n", 1)[0].strip()
        if not re.search(r"^Test Failed\.", section, flags=re.M):  # ctest writes it for timeouts too
            continue
        body = section.split("Output:\n", 1)[-1]
        body = body.split("<end of output>", 1)[0]
        lines = body.splitlines()
        if lines and set(lines[0]) == {"-"}:
            lines = lines[1:]
        yield name, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build_dir")
    ap.add_argument("--lines", type=int, default=150)
    a = ap.parse_args()
    log = pathlib.Path(a.build_dir) / "Testing" / "Temporary" / "LastTest.log"
    if not log.exists():
        print(f"show_failed_tests: {log} not found", file=sys.stderr)
        return 0
    for name, lines in failed_outputs(log.read_text(errors="replace")):
        shown = lines[-a.lines:]
        print(f"\n===== failed: {name} (last {len(shown)} of {len(lines)} output lines) =====")
        print("\n".join(shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
