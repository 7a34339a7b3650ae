"""How many CPUs this process may use."""
import os


def available_cpus():
    """CPUs this process may run on (its affinity mask, e.g. under taskset or
    a container's cpuset), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1
