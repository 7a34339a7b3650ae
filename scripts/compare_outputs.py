"""Every command's outputs from two versions of streamtrace, compared byte by byte.

    python scripts/compare_outputs.py --base HEAD~1            # base commit vs the working tree
    python scripts/compare_outputs.py --base v1 --other v2     # two commits
    python scripts/compare_outputs.py --base HEAD~1 --dense    # also the 25,004-instance dense set

Each version is checked out into a temporary worktree and its C core built
there; the commands run with that tree first on PYTHONPATH.  Inputs: synthetic
fixtures (several shapes, every injection) and, when ../shared is beside the
checkout, every real trace set.  Outputs compared: collective-report CSVs
(plain and with --blocking_analysis), xlsx cell values, blockers' text, the
extracted stream (every frame but the per-rank summaries, which are an
internal state whose layout may change) and its dumps, the align and correlate
stages' streams (from the extracted file), the staged extract |
align | correlate | report CSVs, and fused traces.  Prints one line per
difference; exits 1 if any.  ``--skip NAME`` leaves out commands whose
output is meant to change.  With ``STREAMTRACE_SUMMARIES_MIN_BYTES=0`` in
the environment every trace is summarized (the staged stages then read the
summaries of even the small fixtures).
"""
import argparse
import contextlib
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL = os.path.normpath(os.path.join(ROOT, "..", "shared", "traces", "real"))
PY = sys.executable


def build_tree(rev, workdir):
    """A checkout of ``rev`` (None: the working tree) with its C core built in place."""
    if rev is None:
        return ROOT
    tree = os.path.join(workdir, "tree-" + rev.replace("/", "_").replace("~", "_"))
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", tree, rev], check=True,
                   capture_output=True)
    build = subprocess.run([PY, "-c", "import sys; sys.path.insert(0, 'streamtrace'); "
                            "from _build import ffibuilder; ffibuilder.compile(tmpdir='.', verbose=False)"],
                           cwd=tree, capture_output=True, text=True)
    if build.returncode:
        sys.exit(f"building {rev} failed:\n{build.stderr[-2000:]}")
    return tree


@contextlib.contextmanager
def two_trees(base, other, prefix):
    """A temporary folder and the two versions' trees in it (see build_tree);
    the worktrees and the folder removed afterwards (unless ``keep``)."""
    workdir = tempfile.mkdtemp(prefix=prefix)
    trees = []
    try:
        a = build_tree(base, workdir)
        trees.append(a)
        b = build_tree(other, workdir)
        trees.append(b)
        yield workdir, a, b
    finally:
        for t in trees:
            if t != ROOT:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", t], capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)


def fixtures(workdir, dense, only=()):
    """{name: (trace dir, world size)} of synthetic runs and real sets
    (``only``: just these)."""
    gen = os.path.join(ROOT, "fixtures", "generate_fixture.py")
    shapes = {
        "straggler8": ["--ranks", "8", "--straggler_rank", "3", "--straggler_us", "300"],
        "slowkernel8": ["--ranks", "8", "--slow_kernel_rank", "5", "--host_delay_rank", "2", "--all2allv",
                        "--clock_offsets", "random", "--format", "json.gz"],
        "old4tp": ["--ranks", "4", "--layout", "old", "--tp", "2", "--gpus_per_node", "2", "--format", "json.zst"],
        "truncated4": ["--ranks", "4", "--truncate_rank", "1", "--steps", "2"],
    }
    if dense:
        # the 25,004-instance set of bench_report (7 collectives a step)
        shapes["dense4"] = ["--ranks", "4", "--steps", "3572", "--fill_ops", "0", "--jobs", "2"]
    out = {}
    for name, args in shapes.items():
        if only and name not in only:
            continue
        d = os.path.join(workdir, "in", name)
        subprocess.run([PY, gen, "--out", d] + args, check=True, capture_output=True)
        out[name] = (d, args[args.index("--ranks") + 1])
    if os.path.isdir(REAL) and (not only or "param-dlrm" in only):
        out["param-dlrm"] = (os.path.join(REAL, "param-dlrm"), "8")
    if os.path.isdir(REAL) and not only:
        for root, _, files in os.walk(REAL):
            for f in files:
                if ".json" in f and "param-dlrm" not in root:
                    out["real-" + os.path.relpath(os.path.join(root, f), REAL).replace("/", "_")] = (
                        os.path.join(root, f), None)
    return out


def commands(src, world, out):
    """(name, argv or shell text, produced paths) per command on one input."""
    st = f"'{PY}' -m streamtrace.cli"
    if os.path.isdir(src):
        trace = ["--trace_glob", os.path.join(src, "*.json*"), "--rank_regex", r"(?:rank|worker)(?P<rank>\d+)",
                 "--world_size", world]
        one = f"--trace_glob '{os.path.join(src, '*.json*')}' --rank_regex '(?:rank|worker)(?P<rank>\\d+)' " \
              f"--world_size {world}"
    else:
        trace, one = [src], f"'{src}'"
    j = os.path.join
    yield "extract", f"{st} extract {one} -o {j(out, 'run.stev')}", [j(out, "run.stev")]
    yield "dump", f"{st} dump {j(out, 'run.stev')} --what summary > {j(out, 'summary.txt')}", [j(out, "summary.txt")]
    for what, fmt in (("meta", "jsonl"), ("meta", "csv"), ("meta", "table"), ("kernels", "csv"),
                      ("collectives", "jsonl")):
        name = f"dump-{what}.{fmt}"
        yield name, f"{st} dump {j(out, 'run.stev')} --what {what} --format {fmt} > {j(out, name)}", [j(out, name)]
    yield "align", f"{st} align {j(out, 'run.stev')} -o {j(out, 'aligned.stev')}", [j(out, "aligned.stev")]
    yield "correlate", f"{st} correlate {j(out, 'aligned.stev')} -o {j(out, 'correlated.stev')}", \
        [j(out, "correlated.stev")]
    yield "collective-report", f"{st} collective-report {one} --output_csvs_dir {j(out, 'cr')}", [j(out, "cr")]
    yield "collective-report-xlsx", f"{st} collective-report {one} --output_xlsx_path {j(out, 'cr.xlsx')}", \
        [j(out, "cr.xlsx")]
    yield "blocking", f"{st} collective-report {one} --blocking_analysis --output_csvs_dir {j(out, 'crb')}", \
        [j(out, "crb")]
    yield "blockers", f"{st} blockers {' '.join(repr(t) for t in trace) if not os.path.isdir(src) else repr(src)} " \
                      f"> {j(out, 'blockers.txt')}", [j(out, "blockers.txt")]
    yield "staged", (f"{st} extract {one} | {st} align | {st} correlate | "
                     f"{st} report --output_csvs_dir {j(out, 'staged')}"), [j(out, "staged")]
    yield "fuse", f"{st} fuse {one} -o {j(out, 'fused.json')}", [j(out, "fused.json")]


def run_all(tree, inputs, outdir, skip):
    results = {}
    env = dict(os.environ, PYTHONPATH=tree, STREAMTRACE_READ_AHEAD=os.environ.get("STREAMTRACE_READ_AHEAD", "1"))
    for name, (src, world) in inputs.items():
        for cmd_name, cmd, produced in commands(src, world, os.path.join(outdir, name)):
            if cmd_name in skip:
                continue
            os.makedirs(os.path.join(outdir, name), exist_ok=True)
            proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=tree, env=env, capture_output=True,
                                  text=True)
            results[(name, cmd_name)] = (proc.returncode, proc.stderr.strip().splitlines()[-1:] or [""], produced)
    return results


def same(a, b):
    """None when the outputs agree, else what differs."""
    if os.path.isdir(a) or os.path.isdir(b):
        if not (os.path.isdir(a) and os.path.isdir(b)):
            return "one is missing"
        cmp = filecmp.dircmp(a, b)
        diffs = cmp.left_only + cmp.right_only + [f for f in cmp.common_files if not filecmp.cmp(
            os.path.join(a, f), os.path.join(b, f), shallow=False)]
        return ", ".join(sorted(diffs)) or None
    if not (os.path.exists(a) and os.path.exists(b)):
        return None if os.path.exists(a) == os.path.exists(b) else "one is missing"
    if a.endswith(".xlsx"):
        return _xlsx_values(a) != _xlsx_values(b) and "cell values differ" or None
    if a.endswith(".stev"):   # per-rank summaries (frame kind 8) may differ between versions; the rest may not
        return None if _frames_but_summaries(a) == _frames_but_summaries(b) else "frames differ (besides summaries)"
    if a.endswith("fused.json"):   # its trailer records how long the run took
        return None if _without_seconds(a) == _without_seconds(b) else "bytes differ (besides the run's seconds)"
    return None if filecmp.cmp(a, b, shallow=False) else "bytes differ"


def _frames_but_summaries(path):
    """A stream's frames as (kind, rank, payload), SUMMARY frames left out
    (read here, by the layout in docs/stream-format.md, not by either tree)."""
    import struct

    with open(path, "rb") as f:
        data = f.read()
    frames, at = [], 0
    while at < len(data):
        if data[at:at + 8] == b"\x89STEV\r\n\x1a":
            at += 16
            continue
        kind, rank, length = struct.unpack_from("<IIQ", data, at)
        if kind != 8:
            frames.append((kind, rank, data[at + 24:at + 24 + length]))
        at += 24 + length
    return frames


def _without_seconds(path):
    import re

    with open(path, "rb") as f:
        return re.sub(rb'"seconds": ?[0-9.eE+-]+', b'"seconds": 0', f.read())


def _xlsx_values(path):
    import openpyxl

    book = openpyxl.load_workbook(path, read_only=True)
    return {ws.title: [tuple(r) for r in ws.iter_rows(values_only=True)] for ws in book.worksheets}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the commit to compare against")
    ap.add_argument("--other", default=None, help="the commit to compare (default: the working tree)")
    ap.add_argument("--dense", action="store_true", help="also the 25,004-instance dense set (slow)")
    ap.add_argument("--skip", action="append", default=[], help="a command left out (repeatable)")
    ap.add_argument("--only", action="append", default=[], help="only this input set (repeatable), e.g. dense4 or param-dlrm")
    args = ap.parse_args()
    with two_trees(args.base, args.other, "streamtrace-compare-") as (workdir, base, other):
        inputs = fixtures(workdir, args.dense, only=set(args.only))
        a = run_all(base, inputs, os.path.join(workdir, "a"), set(args.skip))
        b = run_all(other, inputs, os.path.join(workdir, "b"), set(args.skip))
        bad = 0
        for key in sorted(a):
            (rc_a, err_a, out_a), (rc_b, err_b, out_b) = a[key], b[key]
            problems = []
            if rc_a != rc_b:
                problems.append(f"exit {rc_a} -> {rc_b} ({err_b[0] or err_a[0]})")
            for pa, pb in zip(out_a, out_b):
                d = same(pa, pb)
                if d:
                    problems.append(f"{os.path.basename(pa)}: {d}")
            status = "DIFFERS: " + "; ".join(problems) if problems else f"same (exit {rc_a})"
            bad += bool(problems)
            print(f"{key[0]:<48} {key[1]:<24} {status}")
        print(f"{len(a)} outputs compared, {bad} differ")
    sys.exit(1 if bad else 0)

if __name__ == "__main__":
    main()
