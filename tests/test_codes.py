"""streamtrace.codes against the pandas operations it stands in for."""
import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrace.codes import Text, dense_rank, group_ids, joined_labels, occurrence

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
