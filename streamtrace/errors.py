"""The exception family.  The CLI turns these into one-line messages."""


class StreamtraceError(Exception):
    """Base class: a user-facing problem (bad input, bad flags, analysis error)."""


class TraceError(StreamtraceError, ValueError):
    """A trace file is unreadable, corrupt or not a trace.

    Also a ValueError: TraceLens's JSON loaders raise ValueError subclasses
    (``json.JSONDecodeError``) for such files, so ``except ValueError`` around
    a TraceLens call still catches it."""

    def __init__(self, path, problem, offset=None):
        self.path = str(path)
        self.problem = problem
        self.offset = offset
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{self.path}{where}: {problem}")

    def __reduce__(self):  # picklable: raised in `-j` worker processes, reported by the parent
        return type(self), (self.path, self.problem, self.offset)


class TraceNotFoundError(TraceError, FileNotFoundError):
    """A trace file does not exist (FileNotFoundError, as TraceLens raises)."""


class StreamFormatError(StreamtraceError):
    """An event stream is corrupt, truncated or of an unknown version."""

    def __init__(self, source, problem, offset=None):
        self.source = str(source)
        self.problem = problem
        self.offset = offset   # byte offset of the bad header or frame in the stream
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{self.source}{where}: {problem}")

    def __reduce__(self):
        return type(self), (self.source, self.problem, self.offset)


# TraceLens raises built-in exceptions; these classes are also those built-ins,
# so code written around TraceLens (``except ValueError``, ``except
# FileNotFoundError``) catches streamtrace's errors in the same situations.

class InvalidArgumentError(StreamtraceError, ValueError):
    """A bad argument or flag value (TraceLens: ValueError), e.g. no
    world_size, two input modes, a pattern without one ``*``, gpus_per_node <= 0."""


class InputNotFoundError(StreamtraceError, FileNotFoundError):
    """Expected trace files are missing (TraceLens: FileNotFoundError), e.g.
    a rank's file, or a glob that matches nothing."""


class MetadataMismatchError(StreamtraceError, ValueError):
    """Ranks disagree on a collective's metadata and ``strict`` is on
    (TraceLens: ValueError)."""


class Interrupted(BaseException):
    """SIGTERM, SIGINT or SIGHUP arrived (raised in the main thread by the
    CLI's handlers).  A BaseException, as KeyboardInterrupt is, so that no
    ``except Exception`` swallows it and every ``finally`` and context
    manager on the way out cleans up: workers ended, temporary files removed."""

    #: the stop signal received, set by the CLI's handler before it raises:
    #: a wait on workers raises it again should the handler's exception have
    #: been swallowed on the way (library code with a bare ``except:``)
    pending = None

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


def os_reason(exc):
    """What went wrong, in the operating system's words (``No space left on
    device``), for an OSError."""
    return exc.strerror or str(exc)


def os_error(path, exc, doing=None, cls=StreamtraceError):
    """The one-line error for an OSError met on ``path``:
    ``PATH: DOING: REASON`` (``cls`` may be any class taking one message)."""
    return cls(f"{path}: {doing}: {os_reason(exc)}" if doing else f"{path}: {os_reason(exc)}")
