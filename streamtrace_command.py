"""The ``streamtrace`` command's entry point, outside the package on purpose.

Importing ``streamtrace`` loads numpy and the C core, which takes a moment;
a Ctrl-C (SIGINT to the whole pipeline) or a SIGTERM arriving meanwhile
would end the command with Python's KeyboardInterrupt traceback, or with no
word at all.  So the stop signals are caught first, here, with nothing but
the standard library loaded; ``streamtrace.cli.run`` then installs its own
handlers, which clean up after the work has started.
"""
import os
import signal
import sys

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _StoppedWhileStarting(BaseException):
    pass


def _stop(signum, frame):
    raise _StoppedWhileStarting(signum)


def main():
    for s in STOP_SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:   # e.g. SIGHUP under nohup stays ignored
            signal.signal(s, _stop)
    try:
        from streamtrace.cli import run
    except _StoppedWhileStarting as stop:   # nothing was written yet: one line, the shell's code for a signal
        signum = stop.args[0]
        print(f"interrupted by {signal.Signals(signum).name}", file=sys.stderr)
        os._exit(128 + signum)
    run()


if __name__ == "__main__":  # pragma: no cover
    main()
