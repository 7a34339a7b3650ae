"""cffi build script for streamtrace's C core (API mode, out of line).

setuptools runs this through ``cffi_modules`` in setup.py; the package never
imports it at run time.  The cdef is cut from the real headers (between the
``CDEF BEGIN``/``CDEF END`` markers) so there is one definition of every
record layout and function signature.
"""
import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(os.path.dirname(HERE), "csrc")
HEADERS = ["st_records.h", "st_tokenizer.h", "st_sweep.h", "st_select.h", "st_cells.h", "st_fuse.h", "st_scan.h",
           "st_pftrace.h"]
SOURCES = ["st_tokenizer.c", "st_inflate.c", "st_sweep.c", "st_select.c", "st_cells.c", "st_fuse.c", "st_scan.c",
           "st_pftrace.c"]


def cdef_from_headers():
    parts = []
    for name in HEADERS:
        with open(os.path.join(CSRC, name)) as f:
            text = f.read()
        for block in re.findall(r"/\* CDEF BEGIN \*/(.*?)/\* CDEF END \*/", text, re.S):
            parts.append(block)
    return "\n".join(parts)


def compile_args():
    args = ["-std=c99", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]
    if os.environ.get("STREAMTRACE_WERROR"):
        args.append("-Werror")
    return args


ffibuilder = FFI()
ffibuilder.cdef(cdef_from_headers())
ffibuilder.set_source(
    "streamtrace._core",
    "".join('#include "%s"\n' % h for h in HEADERS),
    sources=[os.path.relpath(os.path.join(CSRC, s)) for s in SOURCES],
    include_dirs=[os.path.relpath(CSRC)],
    libraries=["z", "m"],
    extra_compile_args=compile_args(),
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
