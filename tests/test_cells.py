"""streamtrace.cells: column texts equal Python's own formatting."""
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrace import cells

grid_floats = st.integers(-10**15, 10**15).map(lambda k: k / 1000.0)
any_floats = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(grid_floats, any_floats, st.sampled_from([-0.0, 0.0, 1e12, -1e12, 999999999999.999])),
                max_size=200))
def test_float_texts_are_repr(values):
    a = np.array(values, dtype=np.float64)
    expected = ["" if math.isnan(v) else float.__repr__(v) for v in a.tolist()]
    assert cells.float_texts(a).tolist() == expected, values
    # the same through the distinct-value path (many repeats)
    rep = np.repeat(a[:5], 40) if len(a) else a
    assert cells.float_texts(rep).tolist() == [("" if math.isnan(v) else float.__repr__(v)) for v in rep.tolist()]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-2**63, 2**63 - 1), max_size=200))
def test_int_texts_are_str(values):
    a = np.array(values, dtype=np.int64)
    assert cells.int_texts(a).tolist() == [str(v) for v in values]
    rep = np.repeat(a[:3], 50) if len(a) else a
    assert cells.int_texts(rep).tolist() == [str(v) for v in rep.tolist()]
