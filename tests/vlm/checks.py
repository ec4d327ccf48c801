"""The vlm tests' assertions: each check prints ok/FAIL and the test goes on; finish() exits non-zero after any
failure, naming them."""

import sys

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def finish():
    print("FAILED: " + "; ".join(failures) if failures else "all passed")
    sys.exit(1 if failures else 0)
