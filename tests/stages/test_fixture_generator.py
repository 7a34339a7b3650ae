"""Tests of fixtures/generate_fixture.py: the synthetic traces are valid Kineto-like JSON and their
truth.json agrees with what was written (recomputed here independently, with decimal arithmetic).
"""

import gzip
import importlib.util
import json
import math
import os
import re
import zlib
from collections import Counter
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

_GEN_PATH = Path(__file__).resolve().parents[2] / "fixtures" / "generate_fixture.py"
_spec = importlib.util.spec_from_file_location("_streamtrace_generate_fixture", _GEN_PATH)
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

MIB = 1 << 20


def _read_text(path):
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    elif raw[:4] == b"\x28\xb5\x2f\xfd":
        zstandard = pytest.importorskip("zstandard")
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    return raw.decode("utf-8")


def _ns(s):
    return int(Decimal(str(s)) * 1000)


def _count(events):
    return dict(Counter(f"{e['ph']}/{e.get('cat', '')}" for e in events))


COMBOS = {
    "new-json": dict(ranks=4, steps=2),
    "old-json": dict(ranks=4, steps=2, layout="old"),
    "new-gz-tp2": dict(ranks=4, steps=2, format="json.gz", tp=2),
    "new-zst-shared-offsets": dict(ranks=4, steps=2, format="json.zst", tp=2, shared_pg_name=True,
                                   clock_offsets="random"),
    "old-gz-offsets-tb": dict(ranks=4, steps=2, layout="old", format="json.gz", name_style="tb",
                              clock_offsets_us=[0, 120, -250, 7]),
}


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = {}
    for name, opts in COMBOS.items():
        if opts.get("format") == "json.zst":
            pytest.importorskip("zstandard")
        d = tmp_path_factory.mktemp(name)
        out[name] = (d, gen.generate(str(d), **opts))
    return out


@pytest.mark.parametrize("name", list(COMBOS))
def test_files_are_valid_and_match_truth(generated, name):
    d, truth = generated[name]
    assert json.loads((d / "truth.json").read_text()) == truth
    new = truth["layout"] == "new"
    for r, fn in truth["files"].items():
        text = _read_text(d / fn)
        doc = json.loads(text)
        keys = list(doc)
        if new:
            assert keys.index("baseTimeNanoseconds") > keys.index("traceEvents")
            assert keys.index("traceName") > keys.index("traceEvents")
            assert set(doc["distributedInfo"]) >= {"pg_config", "nccl_version"}
        else:
            assert "baseTimeNanoseconds" not in doc
            assert doc["distributedInfo"] == {"backend": "nccl", "rank": int(r), "world_size": truth["world_size"]}
            assert "Collective name" not in text and "Process Group" not in text
        assert keys.index("distributedInfo") < keys.index("traceEvents")
        assert doc["distributedInfo"]["rank"] == int(r)
        assert len(doc["deviceProperties"]) == truth["gpus_per_node"]
        events = doc["traceEvents"]
        assert _count(events) == truth["event_counts"][r]
        # timestamp encoding, checked on the raw text
        stamps = re.findall(r'"(?:ts|dur)": (-?[0-9.]+)', text)
        pat = r"\d+\.\d{3}" if new else r"\d+"
        assert stamps and all(re.fullmatch(pat, s) for s in stamps)
        # every NCCL kernel is a truth instance with exactly the written ts/dur
        kernels = [e for e in events if e.get("cat") == "kernel"]
        nccl = [e for e in kernels if "nccl" in e["name"]]
        mine = [c for c in truth["collectives"] if r in c["per_rank"]]
        assert len(nccl) == len(mine)
        by_ts = {(e["tid"], e["ts"]): e for e in nccl}
        for c in mine:
            pr = c["per_rank"][r]
            k = by_ts[(c["stream"], float(pr["ts_us"]))]
            assert k["dur"] == float(pr["dur_us"])
            assert k["name"] == c["kernel_name"]
            if new:
                a = k["args"]
                assert a["Collective name"] == c["trace_collective_name"]
                assert a["Process Group Name"] == c["pg_name"]
                assert a["Process Group Ranks"] == str(c["ranks"])
                assert a["Group size"] == c["group_size"] and a["dtype"] == c["dtype"]
                assert a["Seq"] == c["trace_seq"]
        for k in kernels:
            if new:
                assert k["args"]["External id"] != k["args"]["correlation"]
            else:
                assert k["args"]["External id"] == k["args"]["correlation"]
        # kernels pair with a launch (correlation) and with an ac2g flow pair (id = correlation)
        launches = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
        flows = Counter((e["id"], e["ph"]) for e in events if e.get("cat") == "ac2g")
        for k in kernels:
            c = k["args"]["correlation"]
            assert launches[c]["ts"] <= k["ts"]
            assert flows[(c, "s")] == 1 and flows[(c, "f")] == 1


def test_process_groups(generated):
    _, truth = generated["new-zst-shared-offsets"]
    tp = [g for g in truth["process_groups"] if g["kind"] == "tp"]
    assert len(tp) == 2 and tp[0]["name"] == tp[1]["name"] and tp[0]["ranks"] != tp[1]["ranks"]
    _, truth = generated["new-gz-tp2"]
    names = [(g["name"], tuple(g["ranks"])) for g in truth["process_groups"]]
    assert len({n for n, _ in names}) == len(names) == 1 + 2 + 2
    for c in truth["collectives"]:
        g = next(g for g in truth["process_groups"] if g["name"] == c["pg_name"] and g["ranks"] == c["ranks"])
        assert c["stream"] == g["stream"]
    # seq: 0-based, in time order, per process group
    per_pg = {}
    for c in truth["collectives"]:
        per_pg.setdefault((c["pg_name"], tuple(c["ranks"])), []).append(c)
    for lst in per_pg.values():
        assert [c["seq"] for c in lst] == list(range(len(lst)))
        r0 = str(lst[0]["ranks"][0])
        starts = [c["per_rank"][r0]["true_start_ns"] for c in lst]
        assert starts == sorted(starts)


def test_clock_offsets_applied(generated):
    _, truth = generated["old-gz-offsets-tb"]
    assert truth["clock_offsets_ns"] == {"0": 0, "1": 120000, "2": -250000, "3": 7000}
    assert truth["files"]["1"].startswith("worker1_step_12.") and truth["files"]["1"].endswith(".pt.trace.json.gz")
    for c in truth["collectives"]:
        for r, pr in c["per_rank"].items():
            assert _ns(pr["ts_us"]) == pr["true_start_ns"] + truth["clock_offsets_ns"][r] == pr["written_start_ns"]


def _check_implicit_expected(c):
    """A5.3 recomputed from the per-rank ts/dur strings with exact decimal arithmetic."""
    ex = c["expected"]
    ranks = sorted(c["per_rank"], key=int)
    s = {r: Decimal(c["per_rank"][r]["ts_us"]) for r in ranks}
    d = {r: Decimal(c["per_rank"][r]["dur_us"]) for r in ranks}
    e = {r: s[r] + d[r] for r in ranks}
    lat = min(d.values())
    waits = {r: max(s.values()) - s[r] for r in ranks}
    assert ex["comm_latency"] == float(lat)
    assert {r: Decimal(str(w)) for r, w in ex["waits"].items()} == waits
    assert ex["skew_start"] == float(max(s.values()) - min(s.values()))
    assert ex["skew_end"] == float(max(e.values()) - min(e.values()))
    assert ex["earliest_arrival_rank"] == int(max(ranks, key=lambda r: (waits[r], int(r))))
    assert math.isclose(ex["avg_wait"], float(sum(waits.values()) / len(ranks)), rel_tol=1e-12)
    bpe = {"Float": 4, "Half": 2}[c["dtype"]]
    nelems = c["out_nelems"] if c["collective_name"] == "allgather" else c["in_nelems"]
    full = Fraction(nelems * bpe, MIB)
    assert ex["full_msg_mb"] == float(full)
    algo = (full / 1024) / (Fraction(lat) / 10 ** 6)
    n = c["group_size"]
    factor = Fraction(2 * (n - 1), n) if c["collective_name"] == "allreduce" else Fraction(n - 1, n)
    assert math.isclose(ex["algo_bw"], float(algo), rel_tol=1e-12)
    assert math.isclose(ex["bus_bw"], float(algo * factor), rel_tol=1e-12)
    # true (offset-free) ends: all ranks finish together (0..800 ns jitter, or 1 us in integer-us traces)
    true_end = [p["end_ns"] for p in c["per_rank"].values()]
    assert max(true_end) - min(true_end) <= 1000


@pytest.mark.parametrize("name", ["new-json", "old-json", "new-zst-shared-offsets"])
def test_allreduce_expected_recomputed(generated, name):
    _, truth = generated[name]
    ars = [c for c in truth["collectives"] if c["collective_name"] == "allreduce"]
    assert ars
    for c in ars:
        _check_implicit_expected(c)
    for c in truth["collectives"]:
        if c["implicit_sync"]:
            _check_implicit_expected(c)


def test_determinism(tmp_path):
    pytest.importorskip("zstandard")
    opts = dict(ranks=3, steps=2, tp=1, straggler_rank=1, clock_offsets="random", inflate_kernel_factor=1.5)
    for fmt in ("json.gz", "json.zst"):
        a, b, c = tmp_path / f"a{fmt}", tmp_path / f"b{fmt}", tmp_path / f"c{fmt}"
        gen.generate(str(a), format=fmt, seed=7, **opts)
        gen.generate(str(b), format=fmt, seed=7, **opts)
        gen.generate(str(c), format=fmt, seed=8, **opts)
        names = sorted(os.listdir(a))
        assert names == sorted(os.listdir(b))
        for fn in names:
            assert (a / fn).read_bytes() == (b / fn).read_bytes(), fn
        assert (a / "rank0_trace" f".{fmt}").read_bytes() != (c / f"rank0_trace.{fmt}").read_bytes()


def test_straggler_is_last_arriver_everywhere(tmp_path):
    truth = gen.generate(str(tmp_path), ranks=4, steps=2, tp=2, straggler_rank=2, straggler_us=400)
    assert truth["straggler"] == {"rank": 2, "delay_us": 400.0}
    seen = 0
    for c in truth["collectives"]:
        if not c["implicit_sync"] or 2 not in c["ranks"]:
            continue
        seen += 1
        starts = {int(r): Decimal(p["ts_us"]) for r, p in c["per_rank"].items()}
        assert max(starts, key=starts.get) == 2
        assert c["expected"]["last_arriver"] == 2 and c["expected"]["true_last_arriver"] == 2
        assert c["expected"]["waits"]["2"] == 0.0
    assert seen >= 8
    assert truth["straggler_summary"]["straggler_rank"] == 2


def test_injected_blockers(tmp_path):
    t = gen.generate(str(tmp_path / "slow"), ranks=4, steps=2, slow_kernel_rank=1, slow_kernel_factor=3.0)
    sk = t["slow_kernel"]
    assert sk["rank"] == 1 and sk["grid"] == [264, 1, 1] and len(sk["instances"]) == 2
    for inst in sk["instances"]:
        assert inst["blocked_rank_is_last_arriver"]
        assert abs(inst["excess_us"] - 2 * sk["base_dur_us"]) < 5
        c = t["collectives"][inst["collective_index"]]
        pr = c["per_rank"]["1"]
        # launched on time, started late: the NCCL kernel starts exactly when the slow kernel ends
        assert _ns(pr["ts_us"]) == _ns(inst["ts_us"]) + _ns(inst["dur_us"])
    t = gen.generate(str(tmp_path / "host"), ranks=4, steps=2, host_delay_rank=3, host_delay_us=500)
    hd = t["host_delay"]
    assert hd["op_name"] == "aten::host_heavy_op" and hd["delay_us"] == 500.0
    doc = json.loads(_read_text(tmp_path / "host" / t["files"]["3"]))
    ops = [e for e in doc["traceEvents"] if e["name"] == "aten::host_heavy_op"]
    assert len(ops) == 2 and all(e["dur"] == 500.0 and e["tid"] == hd["tid"] for e in ops)
    for inst in hd["instances"]:
        assert inst["delayed_rank_is_last_arriver"]
        pr = t["collectives"][inst["collective_index"]]["per_rank"]["3"]
        assert _ns(pr["ts_us"]) - _ns(pr["launch_ts_us"]) < 10_000  # GPU idle: started right after the late launch
    t = gen.generate(str(tmp_path / "infl"), ranks=2, steps=3, inflate_kernel_factor=1.5)
    ik = t["inflated_kernel"]
    over = [i for i in ik["instances"] if i["overlapping"]]
    iso = [i for i in ik["instances"] if not i["overlapping"]]
    assert over and iso
    assert all(i["overlap_frac"] >= 0.5 and float(i["dur_us"]) == ik["inflated_dur_us"] for i in over)
    assert all(i["overlap_frac"] == 0 and float(i["dur_us"]) == ik["base_dur_us"] for i in iso)
    assert math.isclose(ik["inflated_dur_us"] / ik["base_dur_us"], 1.5, rel_tol=1e-3)


def test_all_to_allv_truth(generated):
    d, truth = generated["new-json"]
    a2a = [c for c in truth["collectives"] if c["collective_name"] == "all_to_allv"]
    assert len(a2a) == truth["steps"]
    total = 0
    for c in a2a:
        m = {r: Fraction(p["in_nelems"] * 4, MIB) for r, p in c["per_rank"].items()}
        assert c["expected"]["total_data_mb"] == float(sum(m.values()))
        assert math.isclose(c["expected"]["size_imbalance"], float(max(m.values()) / (sum(m.values()) / len(m))))
        assert max(m, key=m.get) == "0" and c["expected"]["size_imbalance"] > 1.5
        for r, p in c["per_rank"].items():
            assert sum(p["in_split"]) == p["in_nelems"]
        total += sum(p["in_nelems"] * 4 for p in c["per_rank"].values())
    assert sum(h["bytes"] for h in truth["heatmap"]) == total
    doc = json.loads(_read_text(d / truth["files"]["0"]))
    k = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "SendRecv" in e["name"]]
    assert k[0]["args"]["In split size"] == str(a2a[0]["per_rank"]["0"]["in_split"])


@pytest.mark.parametrize("fmt", ["json", "json.gz"])
def test_truncated_rank(tmp_path, fmt):
    truth = gen.generate(str(tmp_path), ranks=2, steps=2, format=fmt, truncate_rank=1, truncate_at_fraction=0.6)
    tr = truth["truncated"]
    path = tmp_path / tr["file"]
    assert path.stat().st_size == tr["truncated_bytes"] == int(tr["original_bytes"] * 0.6)
    raw = path.read_bytes()
    with pytest.raises((ValueError, EOFError, OSError, zlib.error)):
        json.loads(_read_text(path))
    text = (zlib.decompressobj(31).decompress(raw) if fmt == "json.gz" else raw).decode()
    body = text[text.index('"traceEvents": [') + len('"traceEvents": ['):]
    complete = json.loads("[" + body[: body.rindex("\n  }") + 4] + "]")
    assert len(complete) == tr["complete_events"] > 0
    json.loads(_read_text(tmp_path / truth["files"]["0"]))  # the other rank is intact


def test_target_mb(tmp_path):
    truth = gen.generate(str(tmp_path), ranks=1, target_mb=5)
    size = (tmp_path / truth["files"]["0"]).stat().st_size
    assert 4.5e6 <= size <= 5.5e6


def test_sample_trace_and_cli(tmp_path):
    info = gen.write_sample_trace(str(tmp_path / "sample.json"), n_events=4000, seed=1)
    doc = json.loads((tmp_path / "sample.json").read_text())
    assert len(doc["traceEvents"]) == info["events"]
    assert 3600 <= info["events"] <= 4400
    assert gen.main(["--out", str(tmp_path / "cli"), "--ranks", "2", "--steps", "1", "--format", "json.gz",
                     "--clock_offsets_us", "0,3.5", "--layout", "new"]) == 0
    truth = json.loads((tmp_path / "cli" / "truth.json").read_text())
    assert truth["clock_offsets_ns"] == {"0": 0, "1": 3500} and truth["format"] == "json.gz"
    assert (tmp_path / "cli" / "rank1_trace.json.gz").exists()
    with pytest.raises(SystemExit):
        gen.main(["--out", str(tmp_path / "bad"), "--ranks", "8", "--tp", "3"])


# ---------------------------------------------------------------------- messy-run modes (issue #41)


def _nccl_starts(path):
    """Written start (ns, the trace's frame) of each NCCL kernel of a trace, and its ProfilerStep numbers."""
    doc = json.loads(_read_text(path), parse_float=Decimal)
    ev = doc["traceEvents"]
    kernels = sorted(_ns(e["ts"]) for e in ev if e.get("cat") == "kernel" and "nccl" in e["name"])
    steps = sorted(int(e["name"].split("#")[1]) for e in ev if str(e.get("name", "")).startswith("ProfilerStep#"))
    return kernels, steps


def _written(truth, r, indices):
    return sorted(int(truth["collectives"][i]["per_rank"][str(r)]["written_start_ns"]) for i in indices)


@pytest.mark.parametrize("layout", ["new", "old"])
def test_sampled_ranks_and_collectives_recorded(tmp_path, layout):
    truth = gen.generate(str(tmp_path), ranks=6, steps=2, layout=layout, fill_ops=12, present_ranks=[1, 4],
                         sample_fraction=0.5, seed=9)
    m = truth["messy"]
    assert sorted(os.listdir(tmp_path)) == sorted([truth["files"]["1"], truth["files"]["4"], "truth.json"])
    assert m["world_size"] == 6 and m["present_ranks"] == [1, 4] and m["absent_ranks"] == [0, 2, 3, 5]
    held = {}
    for r in (1, 4):
        kernels, steps = _nccl_starts(tmp_path / truth["files"][str(r)])
        held[r] = set(m["collectives"][str(r)])
        assert kernels == _written(truth, r, held[r])
        assert steps == m["steps"][str(r)] == [12, 13]
        assert 0 < len(held[r]) < len(truth["collectives"])   # a sample, not all
    assert held[1] != held[4]   # each rank its own sample
    assert [p["index"] for p in m["pairs"]] == sorted(held[1] & held[4])
    assert all(p["ranks"] == [1, 4] for p in m["pairs"])
    assert set(truth["event_counts"]) == {"1", "4"}


def test_windows_shifted_by_whole_steps(tmp_path):
    truth = gen.generate(str(tmp_path), ranks=3, steps=2, fill_ops=12, window_shift_steps=[0, 1, 2])
    m = truth["messy"]
    assert m["steps"] == {"0": [12, 13], "1": [13, 14], "2": [14, 15]}
    assert m["shared_steps"] == [] and m["left_out_steps"] == [12, 13, 14, 15]
    for r in range(3):
        kernels, steps = _nccl_starts(tmp_path / truth["files"][str(r)])
        assert steps == m["steps"][str(r)]
        assert kernels == _written(truth, r, m["collectives"][str(r)])
        assert {truth["collectives"][i]["step"] + 12 for i in m["collectives"][str(r)]} == set(steps)
    assert {p["step"] for p in m["pairs"]} == {13, 14}


def test_no_collectives_rank_and_too_few(tmp_path):
    truth = gen.generate(str(tmp_path / "a"), ranks=3, steps=2, fill_ops=12, no_collectives_rank=1)
    kernels, steps = _nccl_starts(tmp_path / "a" / truth["files"]["1"])
    assert kernels == [] and steps == [12, 13] and truth["messy"]["no_collectives_ranks"] == [1]
    truth = gen.generate(str(tmp_path / "b"), ranks=3, steps=2, fill_ops=12, max_collectives=2)
    for r in range(3):
        kernels, _ = _nccl_starts(tmp_path / "b" / truth["files"][str(r)])
        assert len(kernels) == 2 and kernels == _written(truth, r, [0, 1])


def test_clean_run_truth_has_no_messy_keys(generated):
    _, truth = generated["new-json"]
    assert "messy" not in truth
    assert set(truth["options"]) == set(gen._Options.FIELDS) - {"jobs"}


def test_bad_messy_options_are_refused(tmp_path):
    for bad in (dict(present_ranks=[0, 9]), dict(present_ranks=[2, 1]), dict(sample_fraction=0),
                dict(window_shift_steps=[0, 1]), dict(no_collectives_rank=5), dict(max_collectives=-1),
                dict(present_ranks=[0], truncate_rank=1)):
        with pytest.raises(ValueError):
            gen.generate(str(tmp_path), ranks=4, steps=1, **bad)


def test_issue41_shape_cli(tmp_path):
    assert gen.main(["--out", str(tmp_path), "--issue41_shape"]) == 0
    truth = json.loads((tmp_path / "truth.json").read_text())
    m = truth["messy"]
    assert truth["layout"] == "old" and truth["steps"] == 2 and m["world_size"] == 128
    assert m["present_ranks"] == [0, 1] and truth["clock_offsets_ns"]["1"] == 0
    assert m["collectives"]["0"] != m["collectives"]["1"] and len(m["pairs"]) == 5
    doc = json.loads(_read_text(tmp_path / truth["files"]["0"]))
    assert not any("Seq" in e.get("args", {}) or "Process Group Name" in e.get("args", {}) for e in doc["traceEvents"])
