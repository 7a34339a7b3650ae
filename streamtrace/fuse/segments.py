"""The output file's bytes: compressed segments (gzip segments joined into one
member, zstd frames, plain), the atomic target (or stdout), copying a part file
into place, and the free-space check of a plain output."""
import contextlib
import os
import shutil
import struct
import time

from ..errors import StreamtraceError
from ..io.outputs import atomic_file, stdout_buffer

GZIP_LEVEL = 1                  # ISA-L levels are 0-3; 1 compresses JSON ~8x at ~0.8 GB/s
ZSTD_LEVEL = 1


class _Segment:
    """Compressed bytes for one piece of the output, written to ``f``.

    gzip: a raw deflate stream ended by a sync flush (byte-aligned, not final),
    so segments compressed independently and in parallel can be joined into
    one gzip member; the CRC and length are kept for the trailer.  zstd: one
    frame.  plain: as is.
    """

    def __init__(self, f, compression):
        self.f, self.kind = f, compression
        self.crc, self.size = 0, 0
        if compression == "gzip":
            from isal import isal_zlib

            self._z = isal_zlib
            self._c = isal_zlib.compressobj(GZIP_LEVEL, isal_zlib.DEFLATED, -15)
        elif compression == "zstd":
            import zstandard

            self._c = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compressobj()
        else:
            self._c = None

    def write(self, data):
        self.size += len(data)
        if self.kind == "gzip":
            self.crc = self._z.crc32(data, self.crc)
            self.f.write(self._c.compress(data))
        elif self.kind == "zstd":
            self.f.write(self._c.compress(data))
        else:
            self.f.write(data)

    def close(self, last=False):
        if self.kind == "gzip":
            self.f.write(self._c.flush(self._z.Z_FINISH if last else self._z.Z_SYNC_FLUSH))
        elif self.kind == "zstd":
            self.f.write(self._c.flush())


class _GzipJoin:
    """Joins gzip segments into one member: header, segments, CRC + size."""

    def __init__(self):
        from isal import isal_zlib

        self._z = isal_zlib
        self.crc, self.size = 0, 0

    @staticmethod
    def header():
        return b"\x1f\x8b\x08\x00" + struct.pack("<I", int(time.time())) + b"\x00\xff"

    def add(self, seg):
        self.crc = self._z.crc32_combine(self.crc, seg.crc, seg.size) if self.size else seg.crc
        self.size += seg.size

    def trailer(self):
        return struct.pack("<II", self.crc & 0xFFFFFFFF, self.size & 0xFFFFFFFF)


@contextlib.contextmanager
def _atomic(path):
    """A binary file at ``path`` that appears only if the block succeeds ('-': stdout)."""
    if path == "-":
        out = stdout_buffer("the fused trace")
        yield out
        out.flush()
        return
    with atomic_file(path) as f:
        yield f


def _copy(src_path, dst):
    with open(src_path, "rb") as src:
        dst.flush()
        try:
            n = os.fstat(src.fileno()).st_size
            while n > 0:
                sent = os.copy_file_range(src.fileno(), dst.fileno(), n)
                if sent == 0:
                    break
                n -= sent
            if n == 0:
                return
        except (AttributeError, OSError, ValueError):
            src.seek(0)
        while True:
            block = src.read(1 << 20)
            if not block:
                break
            dst.write(block)


MIN_EVENT_BYTES = 41   # the shortest X event: {"ph":"X","pid":1,"tid":1,"ts":0,"dur":1}


def _check_target_room(output, events):
    """Refuse, before writing, a plain output that cannot fit in its folder:
    each kept event takes at least ``MIN_EVENT_BYTES`` (a compressed
    output's size is not knowable in advance: not checked)."""
    folder = os.path.dirname(os.path.abspath(output))
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return   # reported when the output is opened
    needed = events * MIN_EVENT_BYTES
    if needed > free:
        raise StreamtraceError(f"{folder}: not enough free space for {output} ({events:,} events need at "
                               f"least {needed >> 20} MiB, {free >> 20} MiB free)")
