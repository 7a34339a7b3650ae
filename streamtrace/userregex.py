"""Regular expressions given by the user (``--rank_regex``, ``fuse --name``).

Python's ``re`` backtracks: a pattern such as ``(a|aa)+$`` takes time
exponential in the text it fails on, and a command can hang for hours on
one file or event name.  These patterns run under the ``regex`` package
(the same syntax as ``re``), whose matching can be stopped: every match
made with one pattern counts against a budget of ``BUDGET_S`` seconds in
all, and a pattern that spends it is refused with one line.
"""
import time

import regex

from .errors import InvalidArgumentError, StreamtraceError

#: seconds one user pattern may spend matching, in all: far above what any
#: reasonable pattern needs on file or event names, far below "hangs"
BUDGET_S = 20.0


class UserRegex:
    """``compile(pattern)``-like, with ``search`` bounded by BUDGET_S in all.
    ``flag`` names the option in the messages (``--rank_regex``)."""

    def __init__(self, pattern, flag):
        self.pattern, self.flag = pattern, flag
        try:
            self._rx = regex.compile(pattern)
        except (regex.error, TypeError) as exc:
            raise StreamtraceError(f"{flag} {pattern!r} is not a valid regular expression: {exc}") from None
        self.groups = self._rx.groups
        self._left = BUDGET_S

    def search(self, text):
        start = time.monotonic()
        try:
            return self._rx.search(text, timeout=max(self._left, 1e-3))
        except TimeoutError:
            raise StreamtraceError(
                f"{self.flag} {self.pattern!r} spent over {BUDGET_S:g} s matching: it backtracks "
                "catastrophically (nested repeats such as (a|aa)+): simplify it") from None
        finally:
            self._left -= time.monotonic() - start
