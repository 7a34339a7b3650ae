"""Report options that need no pandas: the aggregations TraceLens's flags name."""
from ..errors import InvalidArgumentError

DEFAULT_AGG_METRICS = ("mean", "median", "min", "max")
#: aggregations pandas' groupby.agg takes by name (TraceLens passes the user's list to it)
ALLOWED_AGGS = ("mean", "median", "min", "max", "std", "var", "sum", "count", "first", "last", "sem", "prod",
                "nunique", "size")


def check_aggs(agg_metrics):
    """The aggregations to use: names, or callables such as ``np.max`` (pandas'
    groupby.agg takes both, and TraceLens passes the list to it); an
    InvalidArgumentError (a ValueError) for anything else."""
    if isinstance(agg_metrics, str) or callable(agg_metrics):
        agg_metrics = [agg_metrics]   # one aggregation given on its own
    aggs = list(agg_metrics or DEFAULT_AGG_METRICS)
    for a in aggs:
        if not callable(a) and a not in ALLOWED_AGGS:
            raise InvalidArgumentError(f"--agg_metrics: unknown aggregation {a!r} "
                                       f"(use any of {', '.join(ALLOWED_AGGS)}, or a function)")
    return aggs


def agg_label(agg):
    """The column suffix of an aggregation: its name, or a function's
    ``__name__`` (``np.max`` -> "max"), as pandas names aggregated columns."""
    return agg if isinstance(agg, str) else getattr(agg, "__name__", None) or type(agg).__name__
