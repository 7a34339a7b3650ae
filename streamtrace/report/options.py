"""Report options that need no pandas: the aggregations TraceLens's flags name."""
from ..errors import StreamtraceError

DEFAULT_AGG_METRICS = ("mean", "median", "min", "max")
#: aggregations pandas' groupby.agg takes by name (TraceLens passes the user's list to it)
ALLOWED_AGGS = ("mean", "median", "min", "max", "std", "var", "sum", "count", "first", "last", "sem", "prod",
                "nunique", "size")


def check_aggs(agg_metrics):
    """The aggregation names to use; a StreamtraceError for an unknown one."""
    aggs = list(agg_metrics or DEFAULT_AGG_METRICS)
    for a in aggs:
        if a not in ALLOWED_AGGS:
            raise StreamtraceError(f"--agg_metrics: unknown aggregation {a!r} (use any of {', '.join(ALLOWED_AGGS)})")
    return aggs
