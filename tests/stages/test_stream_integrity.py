"""Stream integrity: every frame carries a CRC-32, so a damaged stream is a
one-line error naming the file and the byte offset of the bad frame -- never a
traceback and never a silently different result.  Crafted frames with a valid
checksum but impossible contents (a length past the end, records cut in the
middle, rank 0xFFFFFFFF, an old format version) are refused the same way."""
import io
import os
import random
import re
import struct
import subprocess
import sys

import pytest
from click.testing import CliRunner

import generate_fixture
import hostile
from streamtrace import StreamFormatError, iter_frames, read_stream
from streamtrace.cli import main
from streamtrace.stream.format import FORMAT_VERSION, Kind, encode_frame, header_bytes

BIN = os.path.join(os.path.dirname(sys.executable), "streamtrace")

# command -> (the stream it reads, its output arguments); align reads the
# extracted stream, the later stages the aligned one
STAGES = {"align": ("extracted", ["-o", "out.stev"]), "correlate": ("aligned", ["-o", "out.stev"]),
          "report": ("aligned", ["-o", "out.xlsx"]), "dump": ("aligned", ["--what", "summary"]),
          "blockers": ("aligned", [])}
FLIPS = 60   # random single-bit flips per command


@pytest.fixture(scope="module")
def streams(tmp_path_factory):
    d = tmp_path_factory.mktemp("integrity")
    generate_fixture.generate(str(d / "traces"), ranks=2, steps=1, seed=5)
    for args in (["extract", "--trace_dir", str(d / "traces"), "--world_size", "2", "-o", str(d / "extracted.stev")],
                 ["align", str(d / "extracted.stev"), "-o", str(d / "aligned.stev")]):
        res = CliRunner().invoke(main, [*args, "-q"])
        assert res.exit_code == 0, res.output
    return d


def _run(command, stream, out_dir):
    args = [str(out_dir / a) if a.startswith("out.") else a for a in STAGES[command][1]]
    return CliRunner().invoke(main, [command, str(stream), *args, *([] if command == "dump" else ["-q"])])


def _frame_starts(data):
    """Byte offsets of the stream header and of every frame header."""
    return [0] + [frame.offset for frame in iter_frames(io.BytesIO(data))]


@pytest.mark.parametrize("command", list(STAGES))
def test_single_bit_flips_are_detected(streams, tmp_path, command):
    """Each of FLIPS random single-bit flips: exit 1, one line naming the file
    and the offset of the damaged frame (at or before the flipped byte).  No
    flip may pass: there are no unchecked padding or reserved bits."""
    data = (streams / f"{STAGES[command][0]}.stev").read_bytes()
    starts = _frame_starts(data)
    rng = random.Random(f"flips-{command}")
    for bit in rng.sample(range(8 * len(data)), FLIPS):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        path = tmp_path / "damaged.stev"
        path.write_bytes(bytes(damaged))
        out = tmp_path / "out"
        out.mkdir()
        res = _run(command, path, out)
        where = f"bit {bit} (byte {bit // 8})"
        assert res.exception is None or isinstance(res.exception, SystemExit), (where, res.exception)
        assert res.exit_code == 1, (where, res.output)
        lines = res.output.strip().splitlines()
        assert len(lines) == 1, (where, res.output)
        m = re.match(rf"Error: {re.escape(str(path))} at byte (\d+): ", lines[0])
        assert m, (where, lines[0])
        offset = int(m.group(1))
        # the offset is where the damaged header or frame starts
        assert offset == max(s for s in starts if s <= bit // 8), (where, lines[0])
        assert os.listdir(out) == [], where
        out.rmdir()


def test_undamaged_streams_pass(streams, tmp_path):
    for command, (which, _) in STAGES.items():
        res = _run(command, streams / f"{which}.stev", tmp_path)
        assert res.exit_code == 0, (command, res.output)


def test_flipped_stream_through_a_real_pipe(streams, tmp_path):
    """cat damaged | streamtrace correlate: one line on stderr, exit 1; what it
    had passed on to stdout has no end marker, so the next stage refuses it."""
    data = bytearray((streams / "aligned.stev").read_bytes())
    data[len(data) // 2] ^= 0x10
    res = subprocess.run([BIN, "correlate", "-q"], input=bytes(data), capture_output=True)
    assert res.returncode == 1
    with pytest.raises(StreamFormatError, match="incomplete stream|empty input"):
        list(iter_frames(io.BytesIO(res.stdout)))
    lines = res.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and re.match(r"Error: <stdin> at byte \d+: corrupt frame: checksum mismatch", lines[0])


def test_passed_through_frames_are_copied_byte_for_byte(streams):
    """align copies every input frame's bytes, checksum included."""
    extracted = (streams / "extracted.stev").read_bytes()
    aligned = (streams / "aligned.stev").read_bytes()
    body = extracted[len(header_bytes()):]
    end = [f for f in iter_frames(io.BytesIO(extracted)) if f.kind == Kind.END][-1]
    assert body[:end.offset - len(header_bytes())] in aligned


# ---------------------------------------------------------------- crafted frames

CRAFTED = {name: problem for name, _, problem in hostile.stream_cases(b"")}


@pytest.fixture(scope="module")
def crafted(streams, tmp_path_factory):
    d = tmp_path_factory.mktemp("crafted")
    base = (streams / "extracted.stev").read_bytes()
    for name, data, _ in hostile.stream_cases(base):
        (d / name).write_bytes(data)
    return d


@pytest.mark.parametrize("command", list(STAGES))
@pytest.mark.parametrize("name", list(CRAFTED))
def test_crafted_stream_is_one_line(crafted, tmp_path, command, name):
    path = crafted / name
    res = _run(command, path, tmp_path)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == 1, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert re.match(rf"Error: {re.escape(str(path))} at byte \d+: .*{CRAFTED[name]}", lines[0]), lines[0]
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["frame_length_2_60.stev", "rank_ffffffff.stev"])
def test_crafted_stream_through_a_pipe(crafted, name):
    """The same through a pipe, where the reader cannot know the input's size."""
    res = subprocess.run([BIN, "align", "-q"], input=(crafted / name).read_bytes(), capture_output=True)
    assert res.returncode == 1
    lines = res.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and re.match(r"Error: <stdin> at byte \d+: ", lines[0]), lines


def test_error_offset_is_the_frame_start(crafted):
    """The crafted frame follows the 16-byte stream header: the error names byte 16."""
    with pytest.raises(StreamFormatError) as err:
        read_stream(str(crafted / "events_not_whole_records.stev"))
    assert err.value.offset == 16 and "100 column bytes is not 2 records of 96 bytes" in str(err.value)


def test_format_version_is_4():
    assert FORMAT_VERSION == 4   # 3: packed columns; st_comm.comms_id ("Comms Id"); 4: st_comm.dst_rank, src_rank
    assert struct.unpack_from("<I", header_bytes(), 8)[0] == 4
    assert len(encode_frame(Kind.END, 0, b"{}")) == 24 + 2


# ---------------------------------------------------------------- repeated stages

@pytest.mark.parametrize("command", ["align", "correlate"])
def test_a_repeated_stage_replaces_its_tables_with_a_warning(streams, tmp_path, command):
    """`align | align` and `correlate | correlate` give exactly the stream of
    one run (the input's tables of that stage are dropped and computed again),
    with a warning: never doubled tables."""
    once, twice = tmp_path / "once.stev", tmp_path / "twice.stev"
    res = CliRunner().invoke(main, [command, str(streams / "aligned.stev"), "-q", "-o", str(once)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, [command, str(once), "-o", str(twice)])
    assert res.exit_code == 0, res.output
    assert f"the input already held {command} tables; they are replaced by this run's" in res.output
    assert twice.read_bytes() == once.read_bytes()
    tables = [f.table_name() for f in iter_frames(str(twice)) if f.kind == Kind.TABLE]
    assert len(tables) == len(set(tables))   # every table once
    # through a real pipe as the user writes it
    proc = subprocess.run(f"{BIN} {command} -q {streams / 'aligned.stev'} | {BIN} {command}",
                          shell=True, capture_output=True)
    assert proc.returncode == 0 and proc.stdout == once.read_bytes()
    assert f"already held {command} tables" in proc.stderr.decode()
