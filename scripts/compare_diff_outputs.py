"""``streamtrace diff``'s CSVs and summary from two versions, compared byte by byte.

    python scripts/compare_diff_outputs.py --base HEAD~1            # base commit vs the working tree
    python scripts/compare_diff_outputs.py --base v1 --other v2     # two commits
    python scripts/compare_diff_outputs.py --base HEAD~1 --pair 200:bench/out/diff_base_4x200:bench/out/diff_straggler_4x200

Each version is checked out into a temporary worktree with its C core built
(scripts/compare_outputs.py's build_tree).  Five generated pairs (a
straggler, a slower kernel, a host delay, 8 ranks against 4, a slower
pipeline stage), each diffed as two trace directories, as two extracted
streams with the per-rank summaries (STREAMTRACE_SUMMARIES_MIN_BYTES=0) and
as two without; ``--pair NAME:BASE_DIR:CAND_DIR`` adds trace directories of
your own (as directories and as extracted streams).  Every diff writes its
CSVs and prints its summary; both must agree byte for byte, and so must the
exit status.  Prints one line per difference; exits 1 if any.
"""
import argparse
import filecmp
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = sys.executable
sys.path.insert(0, HERE)
from compare_outputs import two_trees   # noqa: E402

GEN = os.path.join(ROOT, "fixtures", "generate_fixture.py")
RUN = ["--ranks", "4", "--steps", "4", "--seed", "1"]
RUNS = {
    "base": RUN,
    "straggler": RUN + ["--straggler_rank", "2"],
    "slow_kernel_base": RUN + ["--slow_kernel_rank", "1", "--slow_kernel_factor", "1.05"],
    "slow_kernel": RUN + ["--slow_kernel_rank", "1", "--slow_kernel_factor", "3.0"],
    "host_delay": RUN + ["--host_delay_rank", "3"],
    "more_ranks": ["--ranks", "8", "--steps", "3", "--seed", "1"],
    "pipe": ["--pipeline", "--ranks", "4", "--steps", "3", "--seed", "1"],
    "pipe_stage": ["--pipeline", "--ranks", "4", "--steps", "3", "--seed", "1", "--slow_stage", "2"],
}
PAIRS = {"straggler": ("base", "straggler"), "slow_kernel": ("slow_kernel_base", "slow_kernel"),
         "host_delay": ("base", "host_delay"), "more_ranks": ("base", "more_ranks"),
         "pipe_stage": ("pipe", "pipe_stage")}


def inputs(workdir, extra):
    """{pair name: (baseline dir, candidate dir)}, the runs generated once."""
    made = {}
    for name, args in RUNS.items():
        made[name] = os.path.join(workdir, "in", name)
        subprocess.run([PY, GEN, "--out", made[name], *args], check=True, capture_output=True)
    out = {name: (made[b], made[c]) for name, (b, c) in PAIRS.items()}
    for text in extra:
        name, b, c = text.split(":", 2)
        out[name] = (os.path.abspath(b), os.path.abspath(c))
    return out


def run_diffs(tree, pairs, outdir):
    """{(pair, form): (exit status, summary text, CSV folder)} for one version."""
    st = [PY, "-m", "streamtrace.cli"]
    env = dict(os.environ, PYTHONPATH=tree)
    results = {}
    for name, (b, c) in pairs.items():
        forms = {"dirs": (b, c)}
        for form, min_bytes in (("streams_summarized", "0"), ("streams_unsummarized", str(1 << 62))):
            paths = []
            for side, d in (("baseline", b), ("candidate", c)):
                path = os.path.join(outdir, name, f"{side}_{form}.stev")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                subprocess.run(st + ["extract", "--trace_dir", d, "-o", path, "-q"], cwd=tree, check=True,
                               env=dict(env, STREAMTRACE_SUMMARIES_MIN_BYTES=min_bytes), capture_output=True)
                paths.append(path)
            forms[form] = tuple(paths)
        for form, (x, y) in forms.items():
            csvs = os.path.join(outdir, name, form)
            proc = subprocess.run(st + ["diff", x, y, "--output_csvs_dir", csvs, "-q"], cwd=tree, env=env,
                                  capture_output=True, text=True)
            results[(name, form)] = (proc.returncode, proc.stdout, csvs)
    return results


def differences(a, b):
    """What differs between one version's result and the other's."""
    out = []
    if a[0] != b[0]:
        out.append(f"exit {a[0]} != {b[0]}")
    if a[1] != b[1]:
        out.append("summary text differs")
    names = sorted(set(os.listdir(a[2])) | set(os.listdir(b[2]))) if os.path.isdir(a[2]) and \
        os.path.isdir(b[2]) else []
    for f in names:
        pa, pb = os.path.join(a[2], f), os.path.join(b[2], f)
        if not (os.path.exists(pa) and os.path.exists(pb)):
            out.append(f"{f} in one version only")
        elif not filecmp.cmp(pa, pb, shallow=False):
            out.append(f"{f} differs")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the baseline commit")
    p.add_argument("--other", default=None, help="the other commit (default: the working tree)")
    p.add_argument("--pair", action="append", default=[], metavar="NAME:BASE_DIR:CAND_DIR",
                   help="also diff these two trace directories")
    a = p.parse_args()
    with two_trees(a.base, a.other, "streamtrace-compare-diff-") as (workdir, tree_a, tree_b):
        pairs = inputs(workdir, a.pair)
        ra = run_diffs(tree_a, pairs, os.path.join(workdir, "a"))
        rb = run_diffs(tree_b, pairs, os.path.join(workdir, "b"))
        bad = 0
        for key in ra:
            diffs = differences(ra[key], rb[key])
            if diffs:
                bad += 1
                print(f"{key[0]} ({key[1]}): {'; '.join(diffs)}")
        print(f"{len(ra)} diffs compared, {bad} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
