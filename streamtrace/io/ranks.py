"""Finding the per-rank trace files.

Four ways, as TraceLens's collective report has them (spec collective-report.md
A1) plus streamtrace's extensions (B1): a directory, a pattern with one ``*``,
a glob plus a rank regex, or explicit paths.  The result is a list of
``RankInput`` in rank order; a file's rank may still be unknown (None), in
which case extraction takes it from ``distributedInfo.rank``.
"""
import glob as _glob
import logging
import os
import re
from dataclasses import dataclass

from ..errors import InputNotFoundError, InvalidArgumentError

log = logging.getLogger("streamtrace")

DEFAULT_RANK_REGEX = r"rank[\[\-_/]?(?P<rank>\d+)"
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
    if world_size is not None and world_size <= 0:
        raise InvalidArgumentError(f"--world_size must be positive (got {world_size})")
    if paths:
        return [RankInput(str(p), None, i) for i, p in enumerate(paths)]
    if trace_dir:
        return _from_dir(trace_dir, world_size, allow_missing_ranks)
    if trace_pattern:
        return _from_pattern(trace_pattern, world_size, allow_missing_ranks)
    return _from_glob(trace_glob, rank_regex or DEFAULT_RANK_REGEX, world_size, allow_missing_ranks)


def _first_existing(stem):
    found = [stem + suffix for suffix in TRACE_SUFFIXES if os.path.isfile(stem + suffix)]
    if len(found) > 1:
        _warn_two_files(found)
    return found[0] if found else None


def _warn_two_files(paths):
    """One rank in two files (say, a trace and its compressed copy): the first
    is used, and the two may differ, so say so."""
    log.warning(f"{' and '.join(paths)} are the same rank's trace; using {paths[0]}")


def _check_missing(found, world_size, allow_missing, describe):
    missing = [r for r in range(world_size) if r not in found]
    if missing and not allow_missing:
        # the message starts with TraceLens's words for the same error, so
        # scripts that match them keep working
        raise InputNotFoundError(
            f"Expected trace file not found: {describe(missing[0])} (Missing ranks {missing} of world size "
            f"{world_size}; use --allow_missing_ranks to analyse the ranks present)")
    return missing


def _from_dir(trace_dir, world_size, allow_missing):
    if not os.path.isdir(trace_dir):
        raise InputNotFoundError(f"{trace_dir}: --trace_dir is not a directory")
    found = {}
    if world_size is not None:
        for r in range(world_size):
            path = _first_existing(os.path.join(trace_dir, f"rank{r}_trace"))
            if path:
                found[r] = path
    else:
        rx = re.compile(r"^rank(\d+)_trace\.json(\.gz|\.zst)?$")
        for name in sorted(os.listdir(trace_dir)):
            m = rx.match(name)
            if m:
                found.setdefault(int(m.group(1)), []).append(os.path.join(trace_dir, name))
        for r, paths in found.items():
            paths.sort(key=lambda p: [p.endswith(x) for x in TRACE_SUFFIXES[::-1]])  # in TRACE_SUFFIXES order
            if len(paths) > 1:
                _warn_two_files(paths)
            found[r] = paths[0]
    if not found:
        # B1: no rank{i}_trace files; every trace in the directory, rank from distributedInfo
        names = sorted(n for n in os.listdir(trace_dir) if n.endswith(TRACE_SUFFIXES))
        if not names:
            raise InputNotFoundError(f"{trace_dir}: no trace files (*.json, *.json.gz, *.json.zst) in --trace_dir")
        return [RankInput(os.path.join(trace_dir, n), None, i) for i, n in enumerate(names)]
    if world_size is not None:
        _check_missing(found, world_size, allow_missing,
                       lambda r: os.path.join(trace_dir, f"rank{r}_trace.json[.gz|.zst]"))
    return [RankInput(found[r], r, r) for r in sorted(found)]


def _from_pattern(pattern, world_size, allow_missing):
    if pattern.count("*") != 1:
        raise InvalidArgumentError(f"--trace_pattern must contain exactly one '*' (got {pattern!r})")
    if world_size is None:
        raise InvalidArgumentError("--world_size is required with --trace_pattern")
    found = {}
    for r in range(world_size):
        path = pattern.replace("*", str(r))
        if os.path.isfile(path):
            found[r] = path
    _check_missing(found, world_size, allow_missing, lambda r: pattern.replace("*", str(r)))
    return [RankInput(found[r], r, r) for r in sorted(found)]


def _from_glob(pattern, rank_regex, world_size, allow_missing):
    try:
        rx = re.compile(rank_regex)
    except re.error as exc:
        raise InvalidArgumentError(f"--rank_regex {rank_regex!r} is not a valid regular expression: {exc}") from None
    matches = sorted(p for p in _glob.glob(pattern, recursive=True) if os.path.isfile(p))
    if not matches:
        raise InputNotFoundError(f"No files matched --trace_glob: {pattern}")
    found = {}
    for path in matches:
        rank = _rank_from_regex(rx, os.path.basename(path))
        if rank is None:
            rank = _rank_from_regex(rx, path)
        if rank in found:  # first in sorted order wins, as TraceLens does
            _warn_two_files([found[rank], path])
        if rank is None or rank in found:
            continue
        if world_size is not None and rank >= world_size:
            continue
        found[rank] = path
    if not found:
        raise InvalidArgumentError(f"--trace_glob matched {len(matches)} file(s), but none matched "
                                   f"--rank_regex {rank_regex!r}")
    if world_size is not None:
        missing = [r for r in range(world_size) if r not in found]
        if missing and not allow_missing:
            raise InputNotFoundError(f"Missing ranks after glob resolution: {missing} (world size {world_size}; "
                                     "use --allow_missing_ranks to analyse the ranks present)")
    return [RankInput(found[r], r, r) for r in sorted(found)]


def _rank_from_regex(rx, text):
    m = rx.search(text)
    if not m:
        return None
    value = m.groupdict().get("rank") or (m.group(1) if m.re.groups else None)
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
