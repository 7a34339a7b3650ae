"""Clock offsets of many ranks: beyond ``DENSE_FIT_RANKS`` the first fit is
solved sparsely (no ranks x pairs matrix, no dense least squares), and gives
the offsets the dense fit gives, and the injected ones."""
import numpy as np
import pytest

from streamtrace.align import clocks
from streamtrace.align.clocks import estimate_clock_offsets

N = 700   # ranks: above DENSE_FIT_RANKS


def _job(seed=3):
    """Collective participations of N ranks in two unconnected halves (each
    with whole-half instances and instances of groups of 8), their ends
    shifted by known per-rank offsets, with noise and a few outliers."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(-50_000, 50_000, N)
    halves = [np.arange(0, N // 2), np.arange(N // 2, N)]
    inst, rank, end = [], [], []
    k = 0
    for members in halves:
        groups = [members] * 12 + [members[i:i + 8] for i in range(0, len(members), 8) for _ in range(6)]
        for g in groups:
            t = 1_700_000_000_000_000_000 + k * 1_000_000
            inst += [k] * len(g)
            rank += list(g)
            end += list(t + truth[g] + rng.integers(-100, 100, len(g)))
            k += 1
    end = np.array(end)
    end[rng.choice(len(end), 20, replace=False)] += 5_000_000   # outliers
    return np.array(inst), np.array(rank), end, truth


def test_the_sparse_fit_recovers_the_injected_offsets_without_a_dense_solve(monkeypatch):
    assert N > clocks.DENSE_FIT_RANKS

    def refuse(*args, **kwargs):
        raise AssertionError("a dense least-squares solve of every rank")

    monkeypatch.setattr(np.linalg, "lstsq", refuse)
    inst, rank, end, truth = _job()
    est = estimate_clock_offsets(inst, rank, end)
    for half in (range(0, N // 2), range(N // 2, N)):
        ref = half[0]
        for r in half:
            assert est[r]["reference_rank"] == ref
            assert abs(est[r]["offset_ns"] - (truth[r] - truth[ref])) <= 200, r


def test_the_sparse_fit_gives_the_dense_fits_offsets(monkeypatch):
    inst, rank, end, _ = _job(seed=8)
    sparse = estimate_clock_offsets(inst, rank, end)
    monkeypatch.setattr(clocks, "DENSE_FIT_RANKS", N)
    dense = estimate_clock_offsets(inst, rank, end)
    assert {r: e["offset_ns"] for r, e in sparse.items()} == {r: e["offset_ns"] for r, e in dense.items()}
    for r in sparse:
        assert sparse[r]["residual_ns"] == pytest.approx(dense[r]["residual_ns"], abs=1e-3)
        assert sparse[r]["collectives"] == dense[r]["collectives"]
