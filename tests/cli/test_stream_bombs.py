"""Stream bombs (issue #40, items 5 and 8): crafted event streams whose
checksums are right but whose contents are hostile -- frames that inflate to
gigabytes, impossible record counts, huge strings and metadata, string ids
and event indices outside the rank's tables.  Each runs through the real
commands, in a child whose peak RSS (RUSAGE_CHILDREN of a fresh parent)
and time are measured: exit 1, one line naming the stream and the limit or
the field, no output left."""
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import generate_fixture
from streamtrace._native import NOSTR
from streamtrace.stream import packing
from streamtrace.stream.format import Kind, encode_frame, header_bytes, iter_frames

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")
PEAK_MB = 256          # what any crafted stream may cost a command
SECONDS = 30           # and how long it may take (the machine is shared: generous)
GIB = 1 << 30


# ------------------------------------------------------------------ crafting

def zstd_frame(size, prefix=b"", fill=b"\0", suffix=b""):
    """A zstd frame of ``size`` bytes (its content size declared in its
    header): ``prefix``, then ``fill`` repeated, then ``suffix``, written as
    raw and RLE blocks by hand, so a gigabyte costs a few kilobytes and no
    compression time."""
    assert len(prefix) + len(suffix) <= size
    out = [struct.pack("<IB", 0xFD2FB528, 0xE0), struct.pack("<Q", size)]   # single segment, 8-byte size
    block = 128 << 10   # the most a block may hold
    raw = lambda data: [(0, data[i:i + block], len(data[i:i + block])) for i in range(0, len(data), block)]
    left = size - len(prefix) - len(suffix)
    rle = [(1, fill, min(block, left - i)) for i in range(0, left, block)]   # one byte, repeated n times
    blocks = raw(prefix) + rle + raw(suffix)
    for i, (typ, body, n) in enumerate(blocks):
        last = i == len(blocks) - 1
        out.append((last | typ << 1 | n << 3).to_bytes(3, "little") + body)
    if not blocks:
        out.append((1).to_bytes(3, "little"))   # an empty last raw block
    return b"".join(out)


def packed(count, size, body):
    """A packed payload: the envelope, then ``body`` (a zstd frame)."""
    return packing.ENVELOPE.pack(count, packing.CODEC_ZSTD, size) + body


def with_frames(base, first, last=(), meta=False):
    """Stream ``base`` with ``first`` (encoded frames) before its first
    frame of rank 0's own (not a table), or its META frame with ``meta``,
    and ``last`` right after that frame."""
    frames = list(iter_frames(base))
    at = next(i for i, f in enumerate(frames)
              if f.rank == 0 and (f.kind == Kind.META if meta else f.kind not in (Kind.END, Kind.TABLE)))
    out = [header_bytes()]
    for i, f in enumerate(frames):
        if i == at:
            out += first
        out.append(encode_frame(f.kind, f.rank, bytes(f.payload)))
        if i == at:
            out += last
    return b"".join(out)


def with_records(base, kind, change):
    """Stream ``base`` with rank 0's first frame of ``kind`` repacked after
    ``change(records, strings_before, events_before)`` edited its records."""
    out, strings, events, done = [header_bytes()], 0, 0, False
    for f in iter_frames(base):
        payload = bytes(f.payload)
        if f.rank == 0 and f.kind == kind and not done:
            records = f.records().copy()
            change(records, strings, events)
            payload, done = packing.pack_records(records), True
        if f.rank == 0 and f.kind == Kind.STRINGS:
            strings += f.count()
        if f.rank == 0 and f.kind == Kind.EVENTS:
            events += f.count()
        out.append(encode_frame(f.kind, f.rank, payload))
    assert done
    return b"".join(out)


def _events_bomb(size=GIB):
    count = size // 96
    return encode_frame(Kind.EVENTS, 0, packed(count, count * 96, zstd_frame(count * 96)))


def _kernels_count_max():
    count = 2**32 - 1   # a body far too short for it: the envelope alone must refuse it
    return encode_frame(Kind.KERNELS, 0, packed(count, count * 48, zstd_frame(1 << 20)[:13]))


def _string_bomb():
    size = 12 + GIB
    return encode_frame(Kind.STRINGS, 0, packed(1, size, zstd_frame(size, struct.pack("<III", 0, 1, GIB), b"a")))


def _meta_bomb():
    size = 500 << 20
    return encode_frame(Kind.META, 0, packed(1, size, zstd_frame(size, b'{"x":"', b"a", b'"}')))


def _announcement(size):
    """A summaries' announcement whose JSON value (a list of one string) is ``size`` bytes."""
    body = zstd_frame(size, b'["', b"a", b'"]')
    header = (b'{"name":"summaries","version":1,"value_bytes":%d,"arrays":[],"packed":%d,"blobs":[]}'
              % (size, len(body)))
    return encode_frame(Kind.SUMMARY, 0, struct.pack("<I", len(header)) + header + body)


def _frame_over_the_limit_on_the_wire():
    """An EVENTS frame whose payload itself is 20 MiB (incompressible)."""
    count = (20 << 20) // 96
    noise = np.random.default_rng(1).integers(0, 256, count * 96, dtype=np.uint8).tobytes()
    return encode_frame(Kind.EVENTS, 0, packed(count, count * 96, zstd_frame(len(noise), noise)))


BOMBS = {   # name -> (frames put first, what the error line says)
    "events_1gib": (_events_bomb, r"EVENTS frame unpacks to 1073741760 bytes.*STREAMTRACE_MAX_FRAME_BYTES"),
    "events_4gib": (lambda: _events_bomb(4 * GIB), r"EVENTS frame unpacks to 4294967232 bytes.*"
                                                   r"STREAMTRACE_MAX_FRAME_BYTES"),
    "kernels_2_32": (_kernels_count_max, r"KERNELS frame unpacks to 206158430160 bytes.*STREAMTRACE_MAX_FRAME_BYTES"),
    "string_1gib": (_string_bomb, r"STRINGS frame unpacks to 1073741836 bytes.*STREAMTRACE_MAX_FRAME_BYTES"),
    "meta_500mb": (_meta_bomb, r"META frame unpacks to 524288000 bytes.*STREAMTRACE_MAX_FRAME_BYTES"),
    "summary_1gib": (lambda: _announcement(GIB), r"SUMMARY frame unpacks to 1073741824 bytes.*STREAMTRACE_MAX_SUMMARY_BYTES"),
    "wire_20mib": (_frame_over_the_limit_on_the_wire, r"EVENTS frame of 20971\d+ bytes.*STREAMTRACE_MAX_FRAME_BYTES"),
}


def _set_name(records, strings, events):
    records["name"][3] = strings + 1000


def _set_cat(records, strings, events):
    records["cat"][0] = NOSTR - 1


def _set_pid_string(records, strings, events):
    from streamtrace._native import FLAGS

    records["flags"][5] |= FLAGS["pid_str"]
    records["pid"][5] = strings + 7


def _set_kernel_event(records, strings, events):
    records["event"][1] = 0xFFFFFFF0


def _set_comm_event(records, strings, events):
    records["event"][0] = events + 5


def _set_comm_dtype(records, strings, events):
    records["dtype"][0] = strings


BAD_IDS = {   # name -> (kind, change, what the error line says)
    "event_name": (Kind.EVENTS, _set_name, r"EVENTS frame of rank 0: record 3's name is string id \d+, "
                                            r"but the rank has \d+ strings"),
    "event_cat": (Kind.EVENTS, _set_cat, r"EVENTS frame of rank 0: record 0's cat is string id 4294967294"),
    "event_pid": (Kind.EVENTS, _set_pid_string, r"EVENTS frame of rank 0: record 5's pid is string id \d+"),
    "kernel_event": (Kind.KERNELS, _set_kernel_event, r"KERNELS frame of rank 0: record 1's event is "
                                                      r"4294967280, but the rank has \d+ events"),
    "comm_event": (Kind.COMMS, _set_comm_event, r"COMMS frame of rank 0: record 0's event is \d+, "
                                                r"but the rank has \d+ events"),
    "comm_dtype": (Kind.COMMS, _set_comm_dtype, r"COMMS frame of rank 0: record 0's dtype is string id \d+"),
}


# ------------------------------------------------------------------ running

@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """Extracted and aligned streams, with summaries (the stages read those
    instead of a rank's records) and without (they unpack every record):
    {(summarized, aligned): path}."""
    d = tmp_path_factory.mktemp("bombs")
    generate_fixture.generate(str(d / "traces"), ranks=2, steps=1, seed=5)
    out = {}
    for summarized, min_bytes in ((True, "0"), (False, str(1 << 40))):
        env = dict(os.environ, STREAMTRACE_SUMMARIES_MIN_BYTES=min_bytes)
        ext, ali = d / f"{summarized}.extracted.stev", d / f"{summarized}.aligned.stev"
        for args in (["extract", "--trace_dir", str(d / "traces"), "--world_size", "2", "-o", str(ext), "-q"],
                     ["align", str(ext), "-o", str(ali), "-q"]):
            subprocess.run([BIN, *args], check=True, env=env, timeout=300)
        out[summarized, False], out[summarized, True] = str(ext), str(ali)
    return out


def run_child(argv, stdin=None, env=None, address_space=4 * GIB):
    """Run ``argv`` from a fresh Python parent, so that RUSAGE_CHILDREN's
    peak is this command's alone; its address space is capped so that a
    regression fails instead of filling the machine.  (code, stdout,
    stderr, peak RSS in MB, seconds)."""
    script = (
        "import os, resource, subprocess, sys, time\n"
        "def cap():\n"
        f"    resource.setrlimit(resource.RLIMIT_AS, ({address_space}, {address_space}))\n"
        "stdin = open(sys.argv[1], 'rb') if sys.argv[1] else subprocess.DEVNULL\n"
        "t0 = time.monotonic()\n"
        "p = subprocess.run(sys.argv[2:], stdin=stdin, capture_output=True, preexec_fn=cap, timeout=120)\n"
        "t = time.monotonic() - t0\n"
        "sys.stderr.buffer.write(p.stderr)\n"
        "sys.stdout.buffer.write(b'%d %d %.2f\\n' % (p.returncode,"
        " resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024, t))\n"
        "sys.stdout.buffer.write(p.stdout)\n")
    proc = subprocess.run([sys.executable, "-c", script, stdin or "", *argv], capture_output=True, env=env,
                          timeout=300)
    first, _, out = proc.stdout.partition(b"\n")
    code, peak, seconds = first.split()
    return int(code), out.decode(), proc.stderr.decode(), int(peak), float(seconds)


COMMANDS = {   # name -> command, its arguments after the stream (outputs in the test's folder)
    "align": ["align", "-o", "{out}/out.stev", "-q"],
    "report": ["report", "--output_csvs_dir", "{out}/csvs", "-q"],   # aligns the stream it is given
    "correlate": ["correlate", "-o", "{out}/out.stev", "-q"],          # given an aligned stream
    "dump": ["dump", "--what", "events"],
    "dump_kernels": ["dump", "--what", "kernels"],
    "dump_collectives": ["dump", "--what", "collectives"],
}
#: the record frames each command unpacks: a frame is checked when it is
#: unpacked, so a bad id in a kind a command never reads does not stop it
READS = {"align": (Kind.EVENTS, Kind.COMMS), "report": (Kind.EVENTS, Kind.COMMS),
         "correlate": (Kind.EVENTS, Kind.KERNELS), "dump": (Kind.EVENTS,), "dump_kernels": (Kind.KERNELS,),
         "dump_collectives": (Kind.EVENTS, Kind.COMMS)}


def base(bases, command, summarized=False):
    return bases[summarized, command == "correlate"]


def _check(tmp_path, stream, command, expect, stdin=False):
    import re

    out = tmp_path / "out"
    out.mkdir()
    name, *args = [a.format(out=out) for a in COMMANDS[command]]
    argv = [BIN, name, *args] if stdin else [BIN, name, str(stream), *args]
    code, stdout, stderr, peak, seconds = run_child(argv, stdin=str(stream) if stdin else None)
    lines = stderr.strip().splitlines()
    assert code == 1, (code, stderr[-2000:])
    assert len(lines) == 1, stderr[-2000:]
    assert re.search(expect, lines[0]), lines[0]
    assert ("<stdin>" if stdin else str(stream)) in lines[0]
    assert stdout == ""
    assert os.listdir(out) == [], os.listdir(out)
    assert peak <= PEAK_MB, f"{command}: peak RSS {peak} MB"
    assert seconds <= SECONDS, f"{command}: {seconds:.1f} s"
    return lines[0]


@pytest.mark.parametrize("command", ["align", "report", "correlate", "dump"])
@pytest.mark.parametrize("bomb", list(BOMBS))
def test_a_bomb_is_refused_before_it_inflates(bases, tmp_path, bomb, command):
    """Every packed frame's envelope is checked as the frame is read, by
    every command; a summary when it is decoded."""
    make, expect = BOMBS[bomb]
    stream = tmp_path / f"{bomb}.stev"
    stream.write_bytes(with_frames(base(bases, command, summarized=bomb == "summary_1gib"), [make()]))
    assert stream.stat().st_size < (25 << 20)
    if bomb == "summary_1gib" and command == "dump":
        # dump never reads summaries: this one costs it nothing (report reads
        # it: it hands align the stream from a rank's announcement on)
        name, *args = [a.format(out=tmp_path) for a in COMMANDS[command]]
        code, stdout, stderr, peak, seconds = run_child([BIN, name, str(stream), *args])
        assert code == 0 and peak <= PEAK_MB and seconds <= SECONDS, (code, stderr, peak, seconds)
        return
    _check(tmp_path, stream, command, expect)


@pytest.mark.parametrize("command", ["align", "dump"])
def test_a_bomb_on_stdin_names_stdin(bases, tmp_path, command):
    stream = tmp_path / "events_1gib.stev"
    stream.write_bytes(with_frames(base(bases, command), [_events_bomb()]))
    _check(tmp_path, stream, command, BOMBS["events_1gib"][1], stdin=True)


ID_CASES = [(case, command) for case, (kind, _, _) in BAD_IDS.items() for command in COMMANDS
            if kind in READS[command] and (case == "event_name" or command != "dump_collectives")]


@pytest.mark.parametrize("case,command", ID_CASES)
def test_an_id_outside_the_rank_tables_is_refused(bases, tmp_path, case, command):
    kind, change, expect = BAD_IDS[case]
    stream = tmp_path / f"{case}.stev"
    stream.write_bytes(with_records(base(bases, command), kind, change))
    line = _check(tmp_path, stream, command, expect)
    assert "at byte" in line


def test_a_limit_is_raised_by_its_environment_variable(bases, tmp_path):
    """The 20 MiB frame (real events here) goes through once the limit allows it."""
    records = np.zeros((20 << 20) // 96, dtype=Kind.RECORDS[Kind.EVENTS])
    records["name"] = records["cat"] = records["label"] = NOSTR
    frame = encode_frame(Kind.EVENTS, 0, packing.pack_records(records))
    stream = tmp_path / "big.stev"
    stream.write_bytes(with_frames(base(bases, "dump"), [], [frame]))
    argv = [BIN, "dump", str(stream), "--what", "summary"]
    code, _, err, _, _ = run_child(argv)
    assert code == 1 and "STREAMTRACE_MAX_FRAME_BYTES" in err
    env = dict(os.environ, STREAMTRACE_MAX_FRAME_BYTES="32M")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    bad = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, STREAMTRACE_MAX_FRAME_BYTES="lots"))
    assert bad.returncode == 1
    assert bad.stderr.strip() == ("Error: STREAMTRACE_MAX_FRAME_BYTES='lots': expected a size in bytes "
                                  "such as 16M or 1G")


def test_the_limits_bound_streams_read_not_frames_made_in_process(bases, tmp_path):
    """collective-report on trace files never reads a stream: its frames
    are made in the process and not limited (its in-process batches are
    larger than extract's).  The same limit refuses a stream at once."""
    traces = os.path.join(os.path.dirname(base(bases, "align")), "traces")
    env = dict(os.environ, STREAMTRACE_MAX_FRAME_BYTES="1K")
    made = subprocess.run([BIN, "collective-report", "--trace_dir", traces, "--world_size", "2",
                           "--output_csvs_dir", str(tmp_path / "csvs"), "-q"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert made.returncode == 0, made.stderr
    read = subprocess.run([BIN, "align", base(bases, "align"), "-o", str(tmp_path / "out.stev")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert read.returncode == 1
    assert read.stderr.strip().endswith("over the limit of 1024 bytes (raise it with STREAMTRACE_MAX_FRAME_BYTES)")
    assert len(read.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.stev").exists()


def test_a_frame_longer_than_memory_is_one_line(bases, tmp_path):
    """A TABLE frame (not limited: it costs what the input holds) of 4 GiB
    in a sparse file, read with less memory than that: one line, exit 1."""
    from streamtrace.stream.format import _FRAME, frame_crc

    stream = tmp_path / "sparse.stev"
    length = 4 * GIB
    with open(stream, "wb") as f:
        f.write(header_bytes() + _FRAME.pack(Kind.TABLE, 0, length, frame_crc(Kind.TABLE, 0, b""), 0))
        f.seek(length, os.SEEK_CUR)
        f.write(encode_frame(Kind.END, 0, b"{}"))
    code, stdout, stderr, peak, seconds = run_child([BIN, "dump", str(stream), "--what", "meta"],
                                                    address_space=GIB + GIB // 2)
    assert code == 1, stderr[-2000:]
    assert stderr.strip() == f"Error: {stream} at byte 16: TABLE frame of {length} bytes does not fit in memory"
    assert seconds <= SECONDS


@pytest.mark.parametrize("command,case", [("align", "events"), ("report", "events"), ("correlate", "events"),
                                          ("align", "summary"), ("correlate", "summary")])
def test_frames_right_at_the_limits_stay_within_the_bound(bases, tmp_path, command, case):
    """What the defaults let through costs a command less than PEAK_MB:
    six EVENTS frames of 16 MiB each (a million events in 30 KB, string
    ids 0), or an announcement of 48 MiB."""
    from streamtrace.stream.limits import FRAME_DEFAULT, SUMMARY_DEFAULT

    if case == "events":
        n = FRAME_DEFAULT // 96
        events = encode_frame(Kind.EVENTS, 0, packed(n, n * 96, zstd_frame(n * 96)))
        if command == "correlate":   # before rank 0's META frame: the aligned stream's event indices stay right
            data = with_frames(base(bases, command), [events] * 6, meta=True)
        else:   # after rank 0's first STRINGS frame
            data = with_frames(base(bases, command), [], [events] * 6)
    else:
        data = with_frames(base(bases, command, summarized=True), [_announcement(SUMMARY_DEFAULT)])
    stream = tmp_path / "at_the_limits.stev"
    stream.write_bytes(data)
    (tmp_path / "out").mkdir()
    name, *args = [a.format(out=tmp_path / "out") for a in COMMANDS[command]]
    code, _, stderr, peak, seconds = run_child([BIN, name, str(stream), *args])
    assert code == 0, stderr[-2000:]
    assert peak <= PEAK_MB, f"{command}: peak RSS {peak} MB"
    assert seconds <= SECONDS, f"{command}: {seconds:.1f} s"


# ------------------------------------------------------------------ honest streams past the fixed limits
#
# extract never writes a stream its readers refuse with the default
# settings (or with its own): it splits STRINGS frames at the frame limit,
# and a single item (a summary, META, one string) past its limit is read
# when it compresses at most 64 times (real summaries: 3 to 39 times), or
# is stored uncompressed by extract when it compresses better than that.

def _summary_sizes(path):
    """(name, bytes its zstd part unpacks to, bytes of that part) of every
    summary (not the announcements) in a stream."""
    import math

    from streamtrace.stream.summaries import ANNOUNCE, summary_header

    out = []
    for f in iter_frames(path):
        if f.kind == Kind.SUMMARY:
            header, _ = summary_header(f.payload)
            if header["name"] == ANNOUNCE:
                continue
            total = header["value_bytes"]
            for dtype, shape, *_ in header["arrays"]:
                total += -total % 8 + np.dtype(dtype).itemsize * math.prod(shape)
            out.append((header["name"], total, header["packed"]))
    return out


def _csvs(directory):
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def _run(argv, env, check=True):
    proc = subprocess.run([BIN, *argv], capture_output=True, text=True, env=env, timeout=300)
    assert not check or proc.returncode == 0, (argv, proc.stderr[-2000:])
    return proc


@pytest.mark.parametrize("ratio", [None, "2"])
def test_summaries_past_the_summary_limit_are_read(bases, tmp_path, ratio):
    """A rank's summary past STREAMTRACE_MAX_SUMMARY_BYTES (8K here: the
    fixture's correlate summaries are 16 KB; a 5 GB rank's pass 48 MiB) is read by align and
    report with that setting: it compresses ~3 times, within the ratio.
    With a ratio of 2 extract stores the summaries that compress better,
    and they read back too.  The same report as from the rank's events."""
    traces = os.path.join(os.path.dirname(base(bases, "align")), "traces")
    env = dict(os.environ, STREAMTRACE_SUMMARIES_MIN_BYTES="0", STREAMTRACE_MAX_SUMMARY_BYTES="8K")
    if ratio:
        env["STREAMTRACE_MAX_UNPACK_RATIO"] = ratio
    stream, aligned = tmp_path / "run.stev", tmp_path / "aligned.stev"
    _run(["extract", "--trace_dir", traces, "--world_size", "2", "-o", str(stream), "-q"], env)
    sizes = _summary_sizes(str(stream))
    past = [(unpacked, packed) for _, unpacked, packed in sizes if unpacked > 8 << 10]
    assert len(past) >= 2, sizes
    if ratio:
        assert any(packed > unpacked for unpacked, packed in past), sizes   # stored
        assert all(unpacked <= 2 * packed for unpacked, packed in past), sizes
    else:
        assert all(packed * 2 < unpacked for unpacked, packed in past), sizes   # compressed
    events = tmp_path / "events.stev"
    _run(["extract", "--trace_dir", traces, "--world_size", "2", "-o", str(events), "-q", "--no_summaries"], env)
    for name, source in (("staged", stream), ("want", events)):   # align and correlate read a summary each
        _run(["align", str(source), "-o", str(aligned), "-q"], env)
        _run(["correlate", str(aligned), "-o", str(tmp_path / "correlated.stev"), "-q"], env)
        _run(["report", str(tmp_path / "correlated.stev"), "--output_csvs_dir", str(tmp_path / name), "-q"], env)
    _run(["report", str(stream), "--output_csvs_dir", str(tmp_path / "report"), "-q"], env)
    _run(["report", str(events), "--output_csvs_dir", str(tmp_path / "report_want"), "-q"], env)
    want = _csvs(tmp_path / "want")
    assert len(want) > 5
    assert _csvs(tmp_path / "staged") == want
    assert _csvs(tmp_path / "report") == _csvs(tmp_path / "report_want")
    # a reader with the defaults reads what this setting wrote
    _run(["align", str(stream), "-o", str(tmp_path / "default.stev"), "-q"], dict(os.environ))


def test_real_summaries_are_read_by_their_compression_ratio(real_dir, tmp_path):
    """Real ranks' summaries with the summary limit out of the way (1K):
    each is admitted by the ratio alone, compressed (none stored), and
    align reads them."""
    env = dict(os.environ, STREAMTRACE_SUMMARIES_MIN_BYTES="0", STREAMTRACE_MAX_SUMMARY_BYTES="1K")
    sets = [os.path.join(real_dir, "param-dlrm"), os.path.join(real_dir, "hta", "df_index_resolver")]
    for i, d in enumerate(sets):
        stream = tmp_path / f"{i}.stev"
        files = sorted(os.path.join(d, f) for f in os.listdir(d) if ".json" in f)
        _run(["extract", *files, "-o", str(stream), "-q"], env)
        sizes = _summary_sizes(str(stream))
        assert len(sizes) == 2 * len(files)
        for name, unpacked, packed in sizes:
            assert 1 << 10 < unpacked <= 64 * packed and packed < unpacked, (d, name, unpacked, packed)
        _run(["align", str(stream), "-o", str(tmp_path / f"{i}.aligned.stev"), "-q"], env)


def _long_kernel_names(src, dst, count, length):
    """Trace ``src`` with its first ``count`` compute kernels renamed to
    distinct names of ``length`` characters (templated C++ names run to
    hundreds of KB); the names, in order."""
    import json

    with open(src) as f:
        trace = json.load(f)
    rng = np.random.default_rng(7)
    names = []
    for e in trace["traceEvents"]:
        if e.get("cat") == "kernel" and "nccl" not in e["name"].lower() and len(names) < count:
            args = ", ".join(f"T{int(x)}" for x in rng.integers(0, 10**6, length // 8))
            e["name"] = f"void k{len(names)}<{args}>"[:length]
            names.append(e["name"])
    assert len(names) == count
    with open(dst, "w") as f:
        json.dump(trace, f)
    return names


def test_extract_splits_strings_past_the_frame_limit(bases, tmp_path):
    """90 kernel names of 200 KB (18 MB of new strings in one batch, over
    the 16 MiB frame limit): extract writes them in several STRINGS
    frames, each within the limit, and every reader takes the stream."""
    import shutil

    from streamtrace import read_stream

    traces = os.path.join(os.path.dirname(base(bases, "align")), "traces")
    shutil.copytree(traces, tmp_path / "traces")
    names = _long_kernel_names(os.path.join(traces, "rank0_trace.json"), tmp_path / "traces" / "rank0_trace.json",
                               90, 200_000)
    stream = tmp_path / "run.stev"
    env = dict(os.environ)
    _run(["extract", "--trace_dir", str(tmp_path / "traces"), "--world_size", "2", "-o", str(stream), "-q"], env)
    sizes = [packing.envelope(f.payload)[2] for f in iter_frames(str(stream)) if f.kind == Kind.STRINGS and f.rank == 0]
    assert len(sizes) >= 2 and max(sizes) <= 16 << 20 and sum(sizes) > 18_000_000, sizes
    strings = read_stream(str(stream))[0].strings
    assert all(name in strings for name in names)
    _run(["align", str(stream), "-o", str(tmp_path / "aligned.stev"), "-q"], env)
    _run(["report", str(stream), "--output_csvs_dir", str(tmp_path / "csvs"), "-q"], env)
    events = _run(["dump", str(stream), "--what", "events"], env).stdout
    assert all(events.count(name) == 1 for name in (names[0], names[45], names[89]))


def test_extract_keeps_its_frames_within_a_lower_frame_limit(bases, tmp_path):
    """STREAMTRACE_MAX_FRAME_BYTES below a frame of 16,384 records (1.5
    MiB): extract writes smaller record frames, read with that setting."""
    traces = os.path.join(os.path.dirname(base(bases, "align")), "traces")
    env = dict(os.environ, STREAMTRACE_MAX_FRAME_BYTES="64K", STREAMTRACE_SUMMARIES_MIN_BYTES="0")
    stream = tmp_path / "run.stev"
    _run(["extract", "--trace_dir", traces, "--world_size", "2", "-o", str(stream), "-q"], env)
    records = [f for f in iter_frames(str(stream)) if f.kind in Kind.RECORDS]
    assert len(records) > 6 and all(packing.envelope(f.payload)[2] <= 64 << 10 for f in records)
    _run(["report", str(stream), "--output_csvs_dir", str(tmp_path / "csvs"), "-q"], env)
