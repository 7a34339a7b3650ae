"""One benchmark case in a fresh process; prints {"seconds", "peak_rss_mb"} as JSON.

    python bench/measure.py extract|extract_inline|extract_zlib|reference|json_load PATH
"""
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run_extract(path):
    from streamtrace import RankInput, extract

    with open(os.devnull, "wb") as null:
        extract([RankInput(path)], null)


def run_reference(path):
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    from reference import reference_extract

    reference_extract(path)


def run_json_load(path):
    with open(path, "rb") as f:
        json.load(f)


def main():
    if sys.argv[1] == "machine_speed":
        print(_machine_speed_here())
        return
    case, path = sys.argv[1], sys.argv[2]
    if case == "extract_zlib":
        os.environ["STREAMTRACE_GZIP"] = "zlib"
        case = "extract"
    if case == "extract_inline":  # no read-ahead thread: one thread does everything
        os.environ["STREAMTRACE_READ_AHEAD"] = "0"
        case = "extract"
    fn = {"extract": run_extract, "reference": run_reference, "json_load": run_json_load}[case]
    t0 = time.perf_counter()
    fn(path)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    print(json.dumps({"seconds": seconds, "peak_rss_mb": peak}))



def machine_speed():
    """A line saying how fast this machine runs now, so figures from
    different days can be compared: a pure-Python loop, a numpy pass over
    memory and a first touch of fresh pages (each the fastest of five, in
    ms; a virtual machine's speed drifts by tens of percent).  Measured in a
    child process: the caller's peak RSS, which the benchmarks' own child
    processes inherit through fork, stays as it was."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "machine_speed"], capture_output=True,
                          text=True, check=True)
    return proc.stdout.strip()


def _machine_speed_here():
    import numpy as np

    def best(fn):
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return 1000 * min(times)

    data = np.arange(1 << 24, dtype=np.int64)   # 128 MiB
    python_ms = best(lambda: sum(range(3_000_000)))
    numpy_ms = best(lambda: np.add(data, 1, out=data))
    touch_ms = best(lambda: np.ones(1 << 24))
    return (f"machine speed: python loop {python_ms:.0f} ms, numpy pass over 128 MiB {numpy_ms:.0f} ms, "
            f"128 MiB of new pages {touch_ms:.0f} ms (lower is faster)")


if __name__ == "__main__":
    main()
