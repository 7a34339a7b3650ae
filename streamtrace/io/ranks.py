"""Finding the per-rank trace files.

Four ways, as TraceLens's collective report has them (spec collective-report.md
A1) plus streamtrace's extensions (B1): a directory, a pattern with one ``*``,
a glob plus a rank regex, or explicit paths.  The result is a list of
``RankInput`` in rank order; a file's rank may still be unknown (None), in
which case extraction takes it from ``distributedInfo.rank``.
"""
import glob as _glob
import itertools
import logging
import os
import re
from dataclasses import dataclass

from ..errors import InputNotFoundError, InvalidArgumentError
from ..remote import is_url, local_path, redact_text
from ..stream.format import MAX_RANK
from ..userregex import UserRegex

log = logging.getLogger("streamtrace")

DEFAULT_RANK_REGEX = r"rank[\[\-_/]?(?P<rank>\d+)"
#: the largest --world_size taken: well above any real job (2^20 ranks), and
#: a bound on what a typo (10^7 for 10^3) can cost
MAX_WORLD_SIZE = 1 << 20
TRACE_SUFFIXES = (".json", ".json.gz", ".json.zst")


@dataclass
class RankInput:
    path: str
    rank: int = None          # from the flag, position or regex; None: ask the trace
    position: int = 0         # fallback rank when the trace does not say

    @property
    def label(self):
        return f"rank {self.rank}" if self.rank is not None else os.path.basename(self.path)


def resolve_inputs(paths=(), trace_dir=None, trace_pattern=None, trace_glob=None,
                   rank_regex=None, world_size=None, allow_missing_ranks=False):
    """Resolve the input flags to a list of RankInput sorted by rank."""
    modes = [m for m, v in (("paths", paths), ("--trace_dir", trace_dir),
                            ("--trace_pattern", trace_pattern), ("--trace_glob", trace_glob)) if v]
    if len(modes) != 1:
        raise InvalidArgumentError(
            "Provide exactly one of: trace paths, --trace_dir, --trace_pattern, --trace_glob"
            + (f" (got {', '.join(modes)})" if modes else ""))
    if world_size is not None and not 0 < world_size <= MAX_WORLD_SIZE:
        raise InvalidArgumentError(f"--world_size must be 1 to {MAX_WORLD_SIZE} (got {world_size})")
    if paths:
        return [RankInput(str(p), None, i) for i, p in enumerate(paths)]
    if trace_dir:
        return _from_dir(trace_dir, world_size, allow_missing_ranks)
    if trace_pattern:
        return _from_pattern(trace_pattern, world_size, allow_missing_ranks)
    return _from_glob(trace_glob, rank_regex or DEFAULT_RANK_REGEX, world_size, allow_missing_ranks)


def _warn_two_files(paths):
    """One rank in two files (say, a trace and its compressed copy): the first
    is used, and the two may differ, so say so."""
    log.warning(f"{' and '.join(paths)} are the same rank's trace; using {paths[0]}")


def _missing_ranks(found, world_size):
    """The missing ranks as text: all of them, or their count and the first
    ten (the work is in the ranks found: a world size of 2^20 with two ranks
    present costs what two ranks cost)."""
    missing = world_size - len(found)
    first = list(itertools.islice((r for r in range(world_size) if r not in found), 10))
    return first, (f"ranks {first}" if missing <= len(first) else f"{missing} ranks " + str(first)[:-1] + ", ...]")


def _check_missing(found, world_size, allow_missing, describe):
    """Refuse missing ranks unless allowed.  The message starts with
    TraceLens's words for the same error, so scripts that match them keep
    working."""
    if len(found) < world_size and not allow_missing:
        first, shown = _missing_ranks(found, world_size)
        raise InputNotFoundError(
            f"Expected trace file not found: {describe(first[0])} (Missing {shown} of world size "
            f"{world_size}; use --allow_missing_ranks to analyse the ranks present)")
    if not found:   # --allow_missing_ranks analyses the ranks present: there must be one
        raise InputNotFoundError(redact_text(f"no trace found for any rank of {describe('*')} "
                                             f"(world size {world_size})"))


def _suffix_order(name):
    """rank{r}_trace.json before .json.gz before .json.zst (TRACE_SUFFIXES order)."""
    return name.endswith(".gz"), name.endswith(".zst"), name


def _rank_of_name(path, digits):
    """The rank a file name gives (decimal digits), refused when no valid rank."""
    rank = int(digits)
    if rank > MAX_RANK:
        raise InvalidArgumentError(f"{path}: rank {digits} in the file name is out of range (0 to {MAX_RANK})")
    return rank


def _listing(trace_dir):
    """``(names, isfile, join)`` for a --trace_dir: one listing of it, and how
    to test and name its entries (a URL's listing holds objects only)."""
    if is_url(trace_dir):
        from ..remote import join, list_files, redact, split_query

        names = list_files(trace_dir)
        if not names:
            raise InputNotFoundError(f"{redact(trace_dir)}: --trace_dir lists no objects (an empty or missing prefix)")
        base, query = split_query(trace_dir)
        if query:   # a token: on each file's URL, after its name
            return names, lambda path: True, lambda d, name: join(base, name) + f"?{query}"
        return names, lambda path: True, join
    if not os.path.isdir(trace_dir):
        raise InputNotFoundError(f"{trace_dir}: --trace_dir is not a directory")
    return os.listdir(trace_dir), os.path.isfile, os.path.join


def _from_dir(trace_dir, world_size, allow_missing):
    trace_dir = local_path(trace_dir)
    listing, isfile, join = _listing(trace_dir)
    # one listing of the directory, whatever the world size: with it, the files
    # rank{r}_trace.json[.gz|.zst] for r < world_size (the first suffix of
    # TRACE_SUFFIXES that exists), else every rank{N}_trace file (the first
    # name in sorted order for each rank)
    rx = re.compile(r"^rank(\d+)_trace\.json(\.gz|\.zst)?$")
    found = {}
    for name in sorted(listing, key=_suffix_order if world_size is not None else None):
        m = rx.match(name)
        if not m:
            continue
        path = join(trace_dir, name)
        if world_size is not None:
            if str(int(m.group(1))) != m.group(1) or int(m.group(1)) >= world_size or not isfile(path):
                continue
        found.setdefault(_rank_of_name(path, m.group(1)), []).append(path)
    for r, paths in found.items():
        if len(paths) > 1:
            _warn_two_files(paths)
        found[r] = paths[0]
    if not found:
        # B1: no rank{i}_trace files; every trace in the directory, rank from distributedInfo
        names = sorted(n for n in listing if n.endswith(TRACE_SUFFIXES))
        if not names:
            raise InputNotFoundError(f"{trace_dir}: no trace files (*.json, *.json.gz, *.json.zst) in --trace_dir")
        return [RankInput(join(trace_dir, n), None, i) for i, n in enumerate(names)]
    if world_size is not None:
        _check_missing(found, world_size, allow_missing,
                       lambda r: join(trace_dir, f"rank{r}_trace.json[.gz|.zst]"))
    return [RankInput(found[r], r, r) for r in sorted(found)]


def _from_pattern(pattern, world_size, allow_missing):
    if pattern.count("*") != 1:
        raise InvalidArgumentError(f"--trace_pattern must contain exactly one '*' (got {pattern!r})")
    if world_size is None:
        raise InvalidArgumentError("--world_size is required with --trace_pattern")
    # the files that exist, found with one glob; '*' stands for a rank written
    # as str(rank) does (no sign, no leading zeros)
    head, tail = pattern.split("*")
    found = {}
    for digits, path in _pattern_matches(local_path(head), tail):
        if digits.isdigit() and digits.isascii() and str(int(digits)) == digits and int(digits) < world_size:
            found[int(digits)] = path
    _check_missing(found, world_size, allow_missing, lambda r: pattern.replace("*", str(r)))
    return [RankInput(found[r], r, r) for r in sorted(found)]


def _pattern_matches(head, tail):
    """``(what '*' stood for, path)`` for each file matching ``head*tail``:
    one glob (a URL: one listing, the paths rebuilt in the user's spelling)."""
    if is_url(head):
        from ..remote import glob, split_query

        # an http(s) query (a token) is no part of the names: matched on the
        # path, sent with the listing, kept on each file's URL
        base, query = split_query(head + "*" + tail)
        suffix = ""
        if query and "*" in base:
            tail, suffix = base.split("*", 1)[1], f"?{query}"
        stripped, files = glob(_glob.escape(head) + "*" + _glob.escape(tail) + suffix, stripped=True)
        head_len = len(stripped.split("*")[0].replace("[*]", "*").replace("[?]", "?").replace("[[]", "["))
        return [(p[head_len:len(p) - len(tail)], head + p[head_len:len(p) - len(tail)] + tail + suffix)
                for p in files if p.endswith(tail) and len(p) >= head_len + len(tail)]
    return [(path[len(head):len(path) - len(tail)], path)
            for path in _glob.glob(_glob.escape(head) + "*" + _glob.escape(tail))
            if path.startswith(head) and path.endswith(tail) and os.path.isfile(path)]


def _from_glob(pattern, rank_regex, world_size, allow_missing):
    rx = UserRegex(rank_regex, "--rank_regex")   # time-bounded: a user pattern may backtrack catastrophically
    pattern = local_path(pattern)
    if is_url(pattern):
        from ..remote import glob, redact

        matches, shown = glob(pattern), redact(pattern)
    else:
        matches = sorted(p for p in _glob.glob(pattern, recursive=True) if os.path.isfile(p))
        shown = pattern
    if not matches:
        raise InputNotFoundError(f"No files matched --trace_glob: {shown}")
    found, outside = {}, False
    for path in matches:
        rank = _rank_from_regex(rx, path.rsplit("/", 1)[-1] if is_url(path) else os.path.basename(path))
        if rank is None:
            rank = _rank_from_regex(rx, path)
        if rank in found:   # the first in sorted order wins, as TraceLens does
            _warn_two_files([found[rank], path])
        if rank is None or rank in found:
            continue
        if world_size is not None and rank >= world_size:
            outside = True
            continue
        if rank > MAX_RANK:
            raise InvalidArgumentError(f"{path}: rank {rank} from --rank_regex is out of range (0 to {MAX_RANK})")
        found[rank] = path
    if not found and outside:
        raise InputNotFoundError(f"no trace found for any rank of --trace_glob {shown} (world size {world_size}; "
                                 f"its {len(matches)} file(s) are ranks {world_size} or above)")
    if not found:
        raise InvalidArgumentError(f"--trace_glob matched {len(matches)} file(s), but none matched "
                                   f"--rank_regex {rank_regex!r}")
    if world_size is not None and len(found) < world_size and not allow_missing:
        raise InputNotFoundError(f"Missing ranks after glob resolution: {_missing_ranks(found, world_size)[1]} "
                                 f"(world size {world_size}; use --allow_missing_ranks to analyse the ranks present)")
    return [RankInput(found[r], r, r) for r in sorted(found)]


def _rank_from_regex(rx, text):
    m = rx.search(text)
    if not m:
        return None
    value = m.groupdict().get("rank") or (m.group(1) if rx.groups else None)
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
