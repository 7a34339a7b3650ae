"""Collective taxonomy: names, categories, dtypes and sizes, bus-bandwidth
factors, process-group rank lists.

Everything here is pure data plus small parsers, shared by ``align`` and
``report``.  Two vocabularies meet here:

* TraceLens's (spec collective-report.md A2): the exact ``Collective name``
  strings PyTorch writes (``allreduce``, ``_allgather_base``, ``all_to_allv``,
  ...) and the five *categories* its report knows (``allreduce``,
  ``reducescatter``, ``allgather``, ``alltoall``, ``alltoallv``);
* streamtrace's *kinds*, a superset of the categories that also names
  broadcast, reduce, send, recv, barrier, gather and scatter, so that
  bandwidth and size statistics cover every collective (spec B5).

Units: "MB" in report columns is MiB (2**20 bytes), "GB/s" is GiB/s
(2**30 bytes per second), as in TraceLens.
"""
import ast
import json
import math
import re

MIB = 1 << 20
GIB = 1 << 30

# ------------------------------------------------------------------ dtypes

#: Element size in bytes of every c10 ScalarType name (as PyTorch writes it
#: in the ``dtype`` arg).  Sub-byte types occupy one byte per element slot.
DTYPE_BYTES = {
    "Byte": 1, "Char": 1, "Short": 2, "Int": 4, "Long": 8,
    "Half": 2, "Float": 4, "Double": 8,
    "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16,
    "Bool": 1, "QInt8": 1, "QUInt8": 1, "QInt32": 4, "BFloat16": 2,
    "QUInt4x2": 1, "QUInt2x4": 1,
    "Bits1x8": 1, "Bits2x4": 1, "Bits4x2": 1, "Bits8": 1, "Bits16": 2,
    "Float8_e5m2": 1, "Float8_e4m3fn": 1, "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1,
    "Float8_e8m0fnu": 1, "Float4_e2m1fn_x2": 1,
    "UInt16": 2, "UInt32": 4, "UInt64": 8,
    "UInt1": 1, "UInt2": 1, "UInt3": 1, "UInt4": 1, "UInt5": 1, "UInt6": 1, "UInt7": 1,
    "Int1": 1, "Int2": 1, "Int3": 1, "Int4": 1, "Int5": 1, "Int6": 1, "Int7": 1,
}

#: The dtypes TraceLens sizes (A2.1); every other dtype is NaN there.  We size
#: all of DTYPE_BYTES (B2); this subset is kept for documentation and tests.
TRACELENS_DTYPE_BYTES = {k: DTYPE_BYTES[k] for k in
                         ("Float", "Int", "Long", "BFloat16", "Half", "Short", "Double", "Bool", "Byte")}

# C++ type names found in ``Input type`` of nccl:* annotations -> ScalarType
_CPP_TYPES = {
    "float": "Float", "double": "Double", "c10::Half": "Half", "c10::BFloat16": "BFloat16",
    "long int": "Long", "long": "Long", "long long": "Long", "int64_t": "Long",
    "int": "Int", "int32_t": "Int", "short int": "Short", "short": "Short", "int16_t": "Short",
    "signed char": "Char", "int8_t": "Char", "unsigned char": "Byte", "uint8_t": "Byte", "bool": "Bool",
    "c10::complex<float>": "ComplexFloat", "c10::complex<double>": "ComplexDouble",
    "c10::complex<c10::Half>": "ComplexHalf",
    "unsigned short": "UInt16", "short unsigned int": "UInt16", "uint16_t": "UInt16",
    "unsigned int": "UInt32", "uint32_t": "UInt32",
    "unsigned long": "UInt64", "long unsigned int": "UInt64", "unsigned long long": "UInt64", "uint64_t": "UInt64",
}


def bytes_per_elem(dtype):
    """Element size of a c10 dtype name, or None when unknown."""
    return DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None


def dtype_from_input_type(text):
    """ScalarType name from an ``Input type`` entry (``"float"``,
    ``"c10::BFloat16"``, ``"long int"``...), or None (``"TensorList"``, ``""``)."""
    if not isinstance(text, str) or not text:
        return None
    if text in _CPP_TYPES:
        return _CPP_TYPES[text]
    bare = text[5:] if text.startswith("c10::") else text
    return bare if bare in DTYPE_BYTES else None


# ------------------------------------------------------------------ names, categories, kinds

#: TraceLens's exact-string map ``Collective name`` -> category (A2.2).
CATEGORY = {
    "allreduce": "allreduce", "allreduce_coalesced": "allreduce",
    "reducescatter": "reducescatter", "_reduce_scatter_base": "reducescatter",
    "reduce_scatter_tensor_coalesced": "reducescatter",
    "allgather": "allgather", "all_gather": "allgather", "_allgather_base": "allgather",
    "all_gather_into_tensor_coalesced": "allgather", "allgather_into_tensor_coalesced": "allgather",
    "all_to_all": "alltoall",
    "all_to_allv": "alltoallv",
}

#: Categories whose collectives synchronise every participant (A2.2).
IMPLICIT_SYNC = frozenset(("allreduce", "reducescatter", "allgather", "alltoall"))

#: streamtrace kind of every collective name we know (superset of CATEGORY).
KIND = dict(CATEGORY)
KIND.update({
    "reduce_scatter": "reducescatter", "allgather_coalesced": "allgather",
    "broadcast": "broadcast", "reduce": "reduce", "send": "send", "recv": "recv",
    "barrier": "barrier", "gather": "gather", "scatter": "scatter",
})


def category(name):
    """TraceLens category of a ``Collective name`` (None when not one of the five)."""
    return CATEGORY.get(name) if isinstance(name, str) else None


def kind(name):
    """streamtrace kind of a ``Collective name`` (None when unknown)."""
    return KIND.get(name) if isinstance(name, str) else None


def bus_factor(kind_or_category, n):
    """Bus-bandwidth factor: bus bw = algo bw * factor.

    A2.2 for allreduce 2(n-1)/n and reducescatter/allgather/alltoall (n-1)/n,
    B5 for broadcast/reduce/send/recv (1).  None when it does not apply or the
    group size is unknown.  (all_to_allv bus bandwidth comes from the actual
    per-rank bytes, see report.)
    """
    if kind_or_category in ("broadcast", "reduce", "send", "recv"):
        return 1.0
    if n is None or (isinstance(n, float) and math.isnan(n)) or n <= 0:
        return None
    n = int(n)
    if kind_or_category == "allreduce":
        return 2.0 * (n - 1) / n
    if kind_or_category in ("reducescatter", "allgather", "alltoall"):
        return (n - 1) / n
    return None


# CPU-side ops -> ``Collective name`` (PyTorch's RECORD_PARAM_COMMS spelling)
_C10D_OPS = {
    "c10d::allreduce_": "allreduce", "c10d::allreduce_coalesced_": "allreduce_coalesced",
    "c10d::broadcast_": "broadcast", "c10d::alltoall_base_": "all_to_allv", "c10d::alltoall_": "all_to_all",
    "c10d::_allgather_base_": "_allgather_base", "c10d::allgather_": "allgather",
    "c10d::allgather_coalesced_": "allgather_coalesced",
    "c10d::allgather_into_tensor_coalesced_": "allgather_into_tensor_coalesced",
    "c10d::_reduce_scatter_base_": "_reduce_scatter_base", "c10d::reduce_scatter_": "reduce_scatter",
    "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced",
    "c10d::reduce_": "reduce", "c10d::send": "send", "c10d::recv_": "recv", "c10d::recv_any_source_": "recv",
    "c10d::barrier": "barrier", "c10d::monitored_barrier_": "barrier",
    "c10d::gather_": "gather", "c10d::scatter_": "scatter",
}
_NCCL_ANNOTATIONS = {
    "nccl:all_reduce": "allreduce", "nccl:allreduce": "allreduce", "nccl:all_reduce_coalesced": "allreduce_coalesced",
    "nccl:allreduce_coalesced": "allreduce_coalesced",
    "nccl:broadcast": "broadcast", "nccl:reduce": "reduce",
    "nccl:all_to_all": "all_to_allv",  # all_to_all_single; nccl:all_to_all is also the list form, see below
    "nccl:_all_gather_base": "_allgather_base", "nccl:all_gather": "allgather",
    "nccl:all_gather_into_tensor_coalesced": "allgather_into_tensor_coalesced",
    "nccl:allgather_coalesced": "allgather_coalesced",
    "nccl:_reduce_scatter_base": "_reduce_scatter_base", "nccl:reduce_scatter": "reduce_scatter",
    "nccl:reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "nccl:send": "send", "nccl:recv": "recv", "nccl:recvAnySource": "recv",
    "nccl:barrier": "barrier", "nccl:gather": "gather", "nccl:scatter": "scatter",
}


def collective_from_ops(annotation, c10d_op):
    """``(Collective name, source)`` implied by the CPU ops around a launch (B2).

    The c10d op is the more specific of the two (``c10d::alltoall_base_`` is
    all_to_allv, ``c10d::alltoall_`` the list form); else the ``nccl:*``
    annotation; else a generic spelling of either name.  ``source`` is
    ``"c10d_op"`` or ``"annotation"``; ``(None, None)`` when neither says
    anything.
    """
    if isinstance(c10d_op, str) and c10d_op in _C10D_OPS:
        return _C10D_OPS[c10d_op], "c10d_op"
    if isinstance(annotation, str) and annotation in _NCCL_ANNOTATIONS:
        return _NCCL_ANNOTATIONS[annotation], "annotation"
    for name, prefix, source in ((c10d_op, "c10d::", "c10d_op"), (annotation, "nccl:", "annotation")):
        if isinstance(name, str) and name.startswith(prefix) and len(name) > len(prefix):
            guess = name[len(prefix):].rstrip("_")
            if guess:
                return guess, source
    return None, None


_KERNEL_RE = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)")
#: kernel-name kinds that carry a collective (SendRecv and Generic do not)
_KERNEL_KIND_NAME = {"AllReduce": "allreduce", "AllGather": "allgather", "ReduceScatter": "reducescatter",
                     "Broadcast": "broadcast", "Reduce": "reduce"}
COLLECTIVE_KERNEL_RE = re.compile(r"nccl|rccl|cross_device_reduce", re.IGNORECASE)


def is_collective_kernel_name(name):
    """A2: the kernel name contains nccl, rccl or cross_device_reduce (any case)."""
    return isinstance(name, str) and COLLECTIVE_KERNEL_RE.search(name) is not None


def kernel_kind(name):
    """The collective token of an NCCL/RCCL kernel name (``AllReduce``,
    ``SendRecv``, ``Generic``...), ``cross_device_reduce`` for vLLM's custom
    all-reduce, else None."""
    if not isinstance(name, str):
        return None
    m = _KERNEL_RE.match(name)
    if m:
        return m.group(1)
    if "cross_device_reduce" in name.lower():
        return "cross_device_reduce"
    return None


def collective_from_kernel_kind(token):
    """``Collective name`` implied by a kernel-name token alone.

    Only vLLM's ``cross_device_reduce`` (A2: ``allreduce``): the spec (B2)
    never takes the kind from an NCCL kernel name alone, since SendRecv and
    Generic kernels run every kind and NQ-era traces run all-reduce in
    SendRecv kernels.  ``kernel_kind_hint`` gives the name's collective for
    information."""
    if token == "cross_device_reduce":
        return "allreduce"
    return None


def kernel_kind_hint(token):
    """The collective an NCCL kernel-name token suggests (AllReduce ->
    allreduce, ...), None for SendRecv / Generic.  Informational only."""
    return _KERNEL_KIND_NAME.get(token)


# ------------------------------------------------------------------ lists held in strings

_INT_RE = re.compile(r"-?\d+")


def parse_rank_list(text):
    """``Process Group Ranks`` -> ``(ranks, truncated)``.

    Accepts a JSON list, a Python list in a string (``"[0, 1]"``) and
    PyTorch's truncated form for groups of more than 30 ranks
    (``"[0, 1, …, 29, ...]"``), which returns the listed prefix with
    ``truncated=True``.  ``(None, False)`` when it is missing or unreadable.
    """
    if isinstance(text, (list, tuple)):
        try:
            return tuple(int(x) for x in text), False
        except (TypeError, ValueError):
            return None, False
    if not isinstance(text, str) or not text.strip():
        return None, False
    s = text.strip()
    if "..." in s or "\u2026" in s:
        head = re.split(r"\.\.\.|\u2026", s, maxsplit=1)[0]
        return tuple(int(x) for x in _INT_RE.findall(head)), True
    try:
        value = json.loads(s)
    except ValueError:
        try:
            value = ast.literal_eval(s)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None, False
    if isinstance(value, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return tuple(value), False
    return None, False


def parse_split(text):
    """``In/Out split size`` -> list of ints, or None when absent, truncated or
    unreadable (never raises)."""
    ranks, truncated = parse_rank_list(text)
    if ranks is None or truncated:
        return None
    return list(ranks)


def _prod(dims):
    n = 1
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            return None
        n *= d
    return n


def input_dims_nelems(text, index=0):
    """Element count of tensor ``index`` of an ``Input Dims`` JSON text.

    ``[[6144]]`` -> 6144; ``[[8, 1024, 8816]]`` -> 72220672; a TensorList
    entry (``[[[2873320]], ...]``) sums its tensors; an empty or scalar entry
    gives None.
    """
    if not isinstance(text, str):
        return None
    try:
        dims = json.loads(text)
    except ValueError:
        return None
    if not isinstance(dims, list) or len(dims) <= index:
        return None
    entry = dims[index]
    if not isinstance(entry, list) or not entry:
        return None
    if all(isinstance(x, list) for x in entry):  # TensorList
        parts = [_prod(x) for x in entry]
        return None if any(p is None for p in parts) else sum(parts)
    return _prod(entry)


def input_type_at(text, index=0):
    """Entry ``index`` of an ``Input type`` JSON text (or None)."""
    if not isinstance(text, str):
        return None
    try:
        types = json.loads(text)
    except ValueError:
        return None
    if isinstance(types, list) and len(types) > index and isinstance(types[index], str):
        return types[index]
    return None


# ------------------------------------------------------------------ size buckets (B5)

SIZE_BUCKETS = ((128, "<128 B"), (1 << 10, "<1 KiB"), (8 << 10, "<8 KiB"), (64 << 10, "<64 KiB"),
                (256 << 10, "<256 KiB"), (1 << 20, "<1 MiB"), (32 << 20, "<32 MiB"), (math.inf, ">=32 MiB"))
SIZE_BUCKET_ORDER = {label: i for i, (_, label) in enumerate(SIZE_BUCKETS)}
SIZE_BUCKET_ORDER["unknown"] = len(SIZE_BUCKETS)


def size_bucket(nbytes):
    """Label of the size bucket of a message of ``nbytes`` ("unknown" for NaN/None)."""
    if nbytes is None or (isinstance(nbytes, float) and math.isnan(nbytes)):
        return "unknown"
    for limit, label in SIZE_BUCKETS:
        if nbytes < limit:
            return label
    return SIZE_BUCKETS[-1][1]
