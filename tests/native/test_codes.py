"""streamtrace.codes against the pandas operations it stands in for."""
import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest

from streamtrace import codes
from streamtrace.codes import Text, dense_rank, factorize, group_ids, joined_labels, occurrence

small_ints = st.lists(st.integers(-3, 3), min_size=0, max_size=60)


key_pairs = small_ints.flatmap(lambda a: st.tuples(
    st.just(a), st.lists(st.integers(-3, 3), min_size=len(a), max_size=len(a)))).map(
    lambda ab: (np.array(ab[0], dtype=np.int64), np.array(ab[1], dtype=np.int64)))


def _ngroup(a, b, sort):
    return pd.DataFrame({"a": a, "b": b}).groupby(["a", "b"], sort=sort).ngroup().to_numpy()


@settings(max_examples=200, deadline=None)
@given(key_pairs)
def test_group_ids_is_groupby_ngroup_unsorted(keys):
    a, b = keys
    if len(a):
        assert (group_ids(a, b) == _ngroup(a, b, sort=False)).all()


@settings(max_examples=200, deadline=None)
@given(key_pairs)
def test_dense_rank_is_groupby_ngroup_sorted(keys):
    a, b = keys
    assert (dense_rank(a, b) == _ngroup(a, b, sort=True)).all()


@settings(max_examples=200, deadline=None)
@given(small_ints)
def test_occurrence_is_cumcount(ids):
    ids = np.array(ids, dtype=np.int64)
    expected = pd.Series(ids).groupby(ids).cumcount().to_numpy() if len(ids) else np.zeros(0, np.int64)
    assert (occurrence(ids) == expected).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "=x", ""])), max_size=40))
def test_text_round_trip_and_maps(values):
    t = Text.of(np.array(values, dtype=object))
    assert t.objects().tolist() == values
    assert t.missing().tolist() == [v is None for v in values]
    assert t.lookup(str.upper, "?").tolist() == [("?" if v is None else v.upper()) for v in values]
    assert t.isin({"a"}).tolist() == [v == "a" for v in values]
    r = t.recode(lambda v: v[:0] or "E", "M")   # every present value becomes "E"
    assert r.objects().tolist() == ["M" if v is None else "E" for v in values]
    if values:
        assert t.at(0) == values[0]
        assert t.take(np.array([0])).objects().tolist() == [values[0]]


def test_joined_labels():
    checks = [("no_launch", np.array([True, False, True, False])),
              ("unmatched", np.array([False, False, True, True]))]
    assert joined_labels(checks, ";").objects().tolist() == ["no_launch", "", "no_launch;unmatched", "unmatched"]


# objects as report columns hold them: a few shared ones, plus equal values in
# distinct objects, missing values of every kind, numbers that compare equal
_POOL = ["pg0", "pg1", "all_reduce", "", None, float("nan"), pd.NA, 1, 1.0, True, 2.5, (1, 2)]


def _object(i, copy):
    v = _POOL[i]
    return "".join(list(v)) if copy and isinstance(v, str) and v else v   # a distinct str object of equal value


object_rows = st.lists(st.tuples(st.integers(0, len(_POOL) - 1), st.booleans()), max_size=80).map(
    lambda rows: np.array([_object(i, c) for i, c in rows] + [None], dtype=object)[:-1])


@pytest.mark.parametrize("na_sentinel", [True, False])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=object_rows)
def test_factorize_is_pandas_factorize(monkeypatch, na_sentinel, values):
    """The identity pass (forced on for short arrays) changes neither the codes nor the uniques."""
    monkeypatch.setattr(codes, "_IDENTITY_MIN", 0)
    want_codes, want_uniques = pd.factorize(values, use_na_sentinel=na_sentinel)
    got_codes, got_uniques = factorize(values, use_na_sentinel=na_sentinel)
    assert got_codes.dtype == np.int64 and got_codes.tolist() == want_codes.tolist()
    assert len(got_uniques) == len(want_uniques)
    # the very objects pandas keeps; without the sentinel pandas makes its
    # own NaN for the missing values' unique (a new object every call)
    assert all(a is b or (pd.isna(a) and pd.isna(b)) for a, b in zip(got_uniques, want_uniques))


def test_factorize_long_and_unhashable():
    values = np.array(["a", None, "b"] * 5000, dtype=object)
    got, uniques = factorize(values)
    assert got.tolist() == pd.factorize(values)[0].tolist() and uniques.tolist() == ["a", "b"]
    nested = np.empty(5000, dtype=object)
    nested[:] = [[1]] * 5000
    with pytest.raises(TypeError):   # as pandas: str_codes relies on it
        factorize(nested)
