"""``tree_cpu``: the CPU seconds of a run's whole process tree, as the verl protocol runs record them
(a Ray run's workers are killed at shutdown, never waited for, so rusage misses them)."""

from __future__ import annotations

import resource
import sys

from train.verl_integration.tree_cpu import run

# a parent that starts a child burning 1 CPU-second, then kills it and exits without waiting for it
PARENT = r"""
import os, signal, subprocess, sys, time
flag = sys.argv[1]
child = subprocess.Popen([sys.executable, "-c", '''
import sys, time
t = time.process_time()
while time.process_time() - t < 1.0:
    pass
open(sys.argv[1], "w").close()
time.sleep(60)
''', flag])
while not os.path.exists(flag):
    time.sleep(0.05)
time.sleep(1.5)  # the sampler's interval is 0.5 s
os.kill(child.pid, signal.SIGKILL)
os._exit(0)
"""


def test_counts_a_child_that_is_killed_and_never_waited_for(tmp_path):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run([sys.executable, "-c", PARENT, str(tmp_path / "burnt")], interval=0.5)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    waited = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert result["rc"] == 0 and result["processes"] == 2
    assert result["cpu_s"] >= 0.9  # the child's second (and the parent's start-up)
    assert waited < result["cpu_s"] - 0.7  # rusage never saw the child's second


def test_the_exit_code_is_the_commands():
    assert run([sys.executable, "-c", "raise SystemExit(3)"], interval=0.2)["rc"] == 3
