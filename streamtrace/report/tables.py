"""The tables a report starts from: the ``align.*`` (and ``correlate.*``)
TABLE frames of a stream, a list of frames or a dict; a stream that has not
been through ``align`` is aligned here, in-process."""
import itertools
import logging
import os

import pandas as pd

from ..align.stage import align_frames
from ..stream.format import Kind, iter_frames

log = logging.getLogger("streamtrace")


def collect_tables(frames, align_clocks=None, gpus_per_node=None):
    """``{name: DataFrame}`` of the TABLE frames of a stream.

    When the stream carries no align results (no ``align.options`` frame
    before its first rank frame), align runs here, in-process, on the
    stream's frames from the first rank frame on (a SUMMARY frame too).
    """
    tables = {}
    it = iter(frames)
    for frame in it:
        if frame.kind == Kind.TABLE:
            name, df = frame.table()
            tables[name] = pd.concat([tables[name], df], ignore_index=True) if name in tables else df
            continue
        # from a rank's first frame on: its summaries' announcement comes first,
        # and align reads the rank's summary instead of its events when it sees it
        if frame.kind in (Kind.SUMMARY, Kind.EVENTS, Kind.STRINGS, Kind.COMMS, Kind.META, Kind.KERNELS) \
                and "align.options" not in tables:
            for f in align_frames(itertools.chain([frame], it), align_clocks=align_clocks,
                                  gpus_per_node=gpus_per_node):
                if f.kind == Kind.TABLE:
                    name, df = f.table()
                    if name.startswith("align.") or name not in tables:
                        tables[name] = df
                    else:
                        tables[name] = pd.concat([tables[name], df], ignore_index=True)
            break
    return tables


def _as_tables(source, align_clocks=None, gpus_per_node=None):
    if isinstance(source, dict):
        return source
    if isinstance(source, (str, bytes, os.PathLike)):
        return collect_tables(iter_frames(source), align_clocks, gpus_per_node)
    return collect_tables(source, align_clocks, gpus_per_node)


def _check_align_options(tables, align_clocks):
    options = tables.get("align.options")
    if align_clocks is None or options is None or not len(options) or "align_clocks" not in options:
        return
    used = str(options["align_clocks"].iloc[-1])
    if used != str(bool(align_clocks)):
        log.warning(f"the stream was aligned with align_clocks={used or 'auto'}: --align_clocks has no effect "
                    "here (run 'streamtrace align --align_clocks' to change it)")
