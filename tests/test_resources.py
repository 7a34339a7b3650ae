"""Resource bounds (issue #24): memory that does not grow with a name's
length, worker counts capped by the work, spills capped by a budget, and
absurd numeric flags refused at once.  Measured in real subprocesses."""
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from streamtrace.cli import main

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")


def invoke(*args, **kwargs):
    return CliRunner().invoke(main, [str(a) for a in args], **kwargs)


def _peak_rss_mb(argv, env=None, address_space=2 << 30):
    """Run ``argv`` from a small Python parent that reports the child's peak
    RSS (ru_maxrss of its only child) in MB; the child's address space is
    capped so a regression fails with an error instead of filling the machine."""
    script = (
        "import resource, subprocess, sys\n"
        f"lim = {address_space}\n"
        "def cap():\n"
        "    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))\n"
        "p = subprocess.run(sys.argv[1:], preexec_fn=cap, capture_output=True)\n"
        "sys.stderr.buffer.write(p.stderr)\n"
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n")
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env,
                          timeout=300)
    code, rss = proc.stdout.split()
    return int(code), int(rss), proc.stderr


def test_dump_summary_memory_does_not_grow_with_the_longest_name(tmp_path):
    """20,000 kernels and one kernel name of 50,000 characters: the summary's
    NCCL count once took kernels x longest name x 4 bytes (~4 GB)."""
    n, long_name = 20_000, "k" * 49_990 + "_ncclRing"
    events = [{"ph": "X", "cat": "kernel", "name": long_name if i == 0 else f"kern{i % 7}",
               "pid": 0, "tid": 7, "ts": i * 10, "dur": 5} for i in range(n)]
    events[1]["name"] = "ncclDevKernel_AllReduce"
    trace = tmp_path / "rank0_trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    stream = tmp_path / "s.stev"
    assert invoke("extract", trace, "-o", stream, "-q").exit_code == 0
    code, rss, err = _peak_rss_mb([BIN, "dump", str(stream), "--what", "summary", "--format", "csv"])
    assert code == 0, err
    assert rss < 500, rss
    res = invoke("dump", stream, "--what", "summary", "--format", "csv")
    row = res.output.splitlines()[1].split(",")
    header = res.output.splitlines()[0].split(",")
    got = dict(zip(header, row))
    assert got["kernels"] == str(n) and got["nccl_kernels"] == "2"
