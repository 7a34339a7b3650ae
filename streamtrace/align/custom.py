"""Custom collective kernels: vendor or framework kernels that are collectives
but not named ``nccl*`` / ``rccl*``, made collectives by user patterns.

The shape is TraceLens's ``custom_collective_patterns`` (NcclAnalyser):
``(regex, collective name)`` pairs; a kernel whose name the regex finds
(``search``, any case) is a collective kernel, of that ``Collective name``
when its own args and CPU ops do not say.  On the command line each pair is
``--custom_collective_pattern 'REGEX=NAME'``.
"""
from .. import collectives as coll
from ..errors import InvalidArgumentError
from ..userregex import UserRegex

FLAG = "--custom_collective_pattern"


class CustomCollectives:
    """Compiled ``(regex, Collective name)`` pairs; picklable (a process
    executor's ranks compile them again)."""

    def __init__(self, patterns):
        self.patterns = tuple(_checked(p) for p in patterns)
        self._compiled = None

    def __getstate__(self):
        return {"patterns": self.patterns}

    def __setstate__(self, state):
        self.patterns, self._compiled = state["patterns"], None

    def _rules(self):
        if self._compiled is None:
            self._compiled = [(UserRegex(f"(?i){rx}", FLAG), name) for rx, name in self.patterns]
        return self._compiled

    def collective_of(self, kernel_name):
        """The Collective name of the first pattern that finds ``kernel_name``, or None."""
        if not isinstance(kernel_name, str):
            return None
        for rx, name in self._rules():
            if rx.search(kernel_name):
                return name
        return None


def _checked(pair):
    try:
        rx, name = pair
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"custom collective pattern {pair!r}: expected a (regex, collective name) "
                                   "pair") from None
    if not isinstance(rx, str) or not rx:
        raise InvalidArgumentError(f"custom collective pattern {pair!r}: the regex must be a non-empty string")
    if coll.kind(name) is None:
        known = ", ".join(sorted(coll.KIND))
        raise InvalidArgumentError(f"custom collective pattern {pair!r}: {name!r} is not a collective name "
                                   f"(one of: {known})")
    try:
        UserRegex(f"(?i){rx}", FLAG)
    except Exception as exc:   # UserRegex says what is wrong with it
        raise InvalidArgumentError(f"custom collective pattern {rx!r}: {exc}") from None
    return rx, name


def custom_collectives(patterns):
    """A CustomCollectives of ``patterns`` (pairs), or None when there are none."""
    return CustomCollectives(patterns) if patterns else None


def parse_cli_pattern(text):
    """``'REGEX=NAME'`` -> (regex, name); the name is after the last ``=``."""
    rx, sep, name = text.rpartition("=")
    if not sep or not rx:
        raise InvalidArgumentError(f"{text!r} is not REGEX=COLLECTIVE_NAME (e.g. 'vendor_allreduce=allreduce')")
    return _checked((rx, name.strip()))
