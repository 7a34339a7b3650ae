"""What a fuse run keeps and how it places it: the options (the CLI flags in
API form), the ``--window`` parser, the output's compression, and the
records one run keeps per rank and returns."""
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from .. import _native
from ..errors import StreamtraceError

F = _native.Fuser.FLAGS


@dataclass
class FuseOptions:
    """What to keep and how to place it (the CLI flags, in API form)."""

    include_pyfunc: bool = False
    keep_spans: bool = False         # keep cat "Trace" (the profiler window span)
    cats: tuple = ()                 # keep only these categories
    name_regex: str = None           # keep only events whose name matches (search, time-bounded: userregex)
    window: tuple = None             # (lo_ns, hi_ns) on the fused timeline; None ends are open
    nccl_only: bool = False          # keep only kernels whose name contains "nccl"
    align_clocks: bool = False
    time_base: bool = False

    def flags(self):
        fl = F["comma_first"]
        if self.include_pyfunc:
            fl |= F["keep_pyfunc"]
        if self.keep_spans:
            fl |= F["keep_spans"]
        if self.cats:
            fl |= F["cat_filter"]
        if self.name_regex is not None:
            fl |= F["name_filter"]
        if self.window is not None:
            fl |= F["window"]
        if self.nccl_only:
            fl |= F["nccl_only"]
        return fl


def _flags_for(rk, opts):
    if rk.mask is not None:
        return F["comma_first"] | F["keep_mask"]
    return opts.flags()


@dataclass
class _Rank:
    rank: int
    path: str
    position: int
    fz: object = None
    stats: dict = None
    tracks: list = None
    trace: dict = field(default_factory=dict)   # top-level members, parsed
    warnings: list = field(default_factory=list)
    base_ns: int = 0
    clock_offset_ns: int = None
    shift_ns: int = 0
    pid_map: dict = field(default_factory=dict)
    truncated_at: int = None
    source_truncated: bool = False
    write_stats: dict = None
    mask: tuple = None                          # (bits, n_events) from a filter_fn
    spilled_runs: int = 0
    id_offset: int = 0
    encoded: dict = None                        # what the .pftrace encoder wrote (pftrace.RankEncoder.stats)


@dataclass
class FuseResult:
    """What ``fuse`` wrote: the output path, per-rank facts, warnings."""

    output: str
    ranks: dict
    events_written: int
    warnings: list
    id_stride: int
    pid_stride: int
    time_base_ns: int
    lane_moves: int
    focus: dict = None               # the --focus window chosen (focus.resolve's info)


_WINDOW_LIMIT_NS = 1 << 63   # the C core's timestamps are int64 nanoseconds


def parse_window(text):
    """``START:END`` in microseconds (decimals allowed, either end may be empty)
    -> (lo_ns, hi_ns) with None for an open end."""
    if text is None:
        return None
    if ":" not in text:
        raise StreamtraceError(f"--window {text!r}: expected START:END in microseconds (either may be empty)")
    lo, hi = text.split(":", 1)

    def ns(v):
        v = v.strip()
        if not v:
            return None
        try:
            d = Decimal(v)
        except InvalidOperation:
            raise StreamtraceError(f"--window {text!r}: {v!r} is not a number of microseconds") from None
        if not d.is_finite():
            raise StreamtraceError(f"--window {text!r}: {v!r} is not a finite number")
        # checked before converting: 1e999999999 as an int would take minutes and gigabytes
        if d.adjusted() > 18 or abs(d) * 1000 >= _WINDOW_LIMIT_NS:   # (the exponent first: no overflow)
            raise StreamtraceError(f"--window {text!r}: {v!r} is out of range (at most "
                                   f"{_WINDOW_LIMIT_NS // 1000:.3e} us either way)")
        return int((d * 1000).to_integral_value())

    lo_ns, hi_ns = ns(lo), ns(hi)
    if lo_ns is not None and hi_ns is not None and hi_ns < lo_ns:
        raise StreamtraceError(f"--window {text!r}: END is before START")
    return lo_ns, hi_ns


def _window_ns(opts):
    if opts.window is None:
        return None
    lo, hi = opts.window
    return (lo if lo is not None else -(1 << 63), hi if hi is not None else (1 << 63) - 1)


def compression_for(path):
    name = str(path).lower()
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith(".zst") or name.endswith(".zstd"):
        return "zstd"
    return "none"
