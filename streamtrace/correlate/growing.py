"""Columns filled part by part, for tables that grow as ranks stream past."""
import numpy as np


class _Growing:
    """Columns filled part by part into arrays with spare room (doubling),
    so that a rank's end takes the arrays as they are instead of
    concatenating its parts.  ``spec``: {name: (dtype, row shape)}."""

    def __init__(self, spec, capacity=4096):
        self.n = 0
        self.cols = {name: np.empty((capacity,) + shape, dtype=dtype) for name, (dtype, shape) in spec.items()}

    def extend(self, m, at_least=0):
        """Room for m more rows: the slice of them (to fill).  When the
        arrays must grow, to at least ``at_least`` rows (else they double)."""
        need = self.n + m
        cap = len(next(iter(self.cols.values())))
        if need > cap:
            size = max(need, at_least, 2 * cap)
            for name, a in self.cols.items():
                grown = np.empty((size,) + a.shape[1:], dtype=a.dtype)
                grown[:self.n] = a[:self.n]
                self.cols[name] = grown
        rows = slice(self.n, need)
        self.n = need
        return rows

    def take(self):
        """The filled rows as {name: array}, the spare room given back in
        place.  numpy refuses that while anything else refers to an array
        (a profiler or tracer holding the bound method does): the rows are
        then copied out instead."""
        cols, self.cols = self.cols, None
        for name in list(cols):
            a = cols.pop(name)
            try:
                a.resize((self.n,) + a.shape[1:])
            except ValueError:
                a = a[:self.n].copy()
            cols[name] = a
        return cols
