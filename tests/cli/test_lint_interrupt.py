"""``attngate lint`` (and ``diff``) stopped by SIGINT (Ctrl-C, or the SIGINT of a CI job's timeout) at any moment
of its run: exit 130, one line on stderr, no traceback; never exit 0 (z3 catches SIGINT in a check and answers
unknown, which lint once read as "no finding", issue 53)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.support.helpers import ROOT

# the command once the program is imported (a SIGINT while Python itself starts is Python's, a KeyboardInterrupt
# in an import), with SIGINT as an interactive shell leaves it (a background job's pytest hands it SIGINT ignored)
PROGRAM = """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
from attngate.cli import main
print("ready", flush=True)
import sys
main(sys.argv[1:])
"""
DIFF = ["diff", "rules.yaml", "rules.yaml"]


@pytest.mark.parametrize(
    "argv, delay",
    # loading the rules, encoding them, the checks, the proofs; diff's encoding and its checks
    [(["lint"], 0.05), (["lint"], 0.2), (["lint"], 0.45), (["lint"], 0.8), (DIFF, 0.05), (DIFF, 0.25)],
)
def test_sigint_stops_lint_and_diff_with_130_and_one_line(argv, delay):
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(delay)
        assert proc.poll() is None, "the command ended before the signal: the delay is too long for this host"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (proc.returncode, out, err) == (130, "", "interrupted\n")
