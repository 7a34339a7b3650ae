"""Which file is which rank: the inputs as given (paths, RankInputs or a
``{rank: path}`` dict), each assigned its rank, ``--ranks`` applied."""
import os

from ..errors import StreamtraceError, TraceError
from ..extract import peek_metadata
from ..io.ranks import RankInput
from .options import _Rank


def _as_rank_inputs(inputs):
    """RankInputs from RankInput/paths (list) or a {rank: path} dict."""
    if isinstance(inputs, dict):
        return [RankInput(str(p), int(r), i) for i, (r, p) in enumerate(inputs.items())]
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    out = []
    for i, x in enumerate(inputs):
        out.append(x if isinstance(x, RankInput) else RankInput(str(x), None, i))
    return out


def _resolve_ranks(inputs, ranks):
    """Assign every input its rank (given, else distributedInfo.rank, else
    position), refuse duplicates, and keep the selected ``ranks``."""
    out = []
    seen = {}
    for inp in inputs:
        r = inp.rank
        if r is None:
            try:
                dist = peek_metadata(inp.path).get("distributedInfo")
            except TraceError:
                dist = None  # reported by the scan, with the reason
            trace_rank = dist.get("rank") if isinstance(dist, dict) else None
            r = trace_rank if isinstance(trace_rank, int) and trace_rank >= 0 else inp.position
        if r in seen:
            raise StreamtraceError(f"{inp.path} and {seen[r]} are both rank {r}: give each rank once")
        seen[r] = inp.path
        out.append(_Rank(rank=int(r), path=inp.path, position=inp.position))
    if ranks is not None:
        wanted = set(int(r) for r in ranks)
        missing = sorted(wanted - set(seen))
        if missing:
            shown = ",".join(map(str, missing[:10])) + (f",... ({len(missing)} in all)" if len(missing) > 10 else "")
            raise StreamtraceError(f"--ranks {shown}: no input has "
                                   f"{'that rank' if len(missing) == 1 else 'those ranks'} "
                                   f"(ranks present: {','.join(map(str, sorted(seen)))})")
        out = [x for x in out if x.rank in wanted]
    if not out:
        raise StreamtraceError("no trace to fuse")
    return sorted(out, key=lambda x: x.rank)
