"""The exception family.  The CLI turns these into one-line messages."""


class StreamtraceError(Exception):
    """Base class: a user-facing problem (bad input, bad flags, analysis error)."""


class TraceError(StreamtraceError):
    """A trace file is unreadable, corrupt or not a trace."""

    def __init__(self, path, problem, offset=None):
        self.path = str(path)
        self.problem = problem
        self.offset = offset
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{self.path}{where}: {problem}")

    def __reduce__(self):  # picklable: raised in `-j` worker processes, reported by the parent
        return type(self), (self.path, self.problem, self.offset)


class StreamFormatError(StreamtraceError):
    """An event stream is corrupt, truncated or of an unknown version."""

    def __init__(self, source, problem):
        self.source = str(source)
        self.problem = problem
        super().__init__(f"{self.source}: {problem}")

    def __reduce__(self):
        return type(self), (self.source, self.problem)


class Interrupted(BaseException):
    """SIGTERM, SIGINT or SIGHUP arrived (raised in the main thread by the
    CLI's handlers).  A BaseException, as KeyboardInterrupt is, so that no
    ``except Exception`` swallows it and every ``finally`` and context
    manager on the way out cleans up: workers ended, temporary files removed."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum

    def __str__(self):
        import signal

        try:
            name = signal.Signals(self.signum).name
        except ValueError:
            name = f"signal {self.signum}"
        return f"interrupted by {name}"
