/*
 * streamtrace record layouts: the single definition of every fixed-size record
 * in the event stream.  The Python side derives its numpy dtypes from these
 * structs through cffi (ffi.offsetof / ffi.sizeof), so there is no second copy.
 *
 * Change any struct here => bump ST_FORMAT_VERSION (readers refuse versions
 * they do not know) and update docs/stream-format.md.  On the wire (version
 * 3 on) record frames hold these fields as compressed columns, padding left
 * out (streamtrace/stream/packing.py); in memory they are these structs.
 *
 * Everything between CDEF BEGIN and CDEF END is fed to cffi's cdef(): keep it
 * to plain declarations and integer #defines.
 */
#ifndef ST_RECORDS_H
#define ST_RECORDS_H

#include <stdint.h>

/* CDEF BEGIN */
#define ST_FORMAT_VERSION 4

/* Absent integer fields hold ST_NONE; absent string ids hold ST_NOSTR. */
#define ST_NOSTR 4294967295

/* st_event.flags */
#define ST_F_PID_STR 1
#define ST_F_TID_STR 2
#define ST_F_HAS_TS 4
#define ST_F_HAS_DUR 8
#define ST_F_BP_E 16
#define ST_F_ID_STR 32
#define ST_F_HAS_ID 64

/*
 * One trace event.  Times are exact integer nanoseconds parsed from the
 * decimal microseconds in the trace, relative to the trace's own time base:
 * add the rank metadata's baseTimeNanoseconds (0 when absent) for Unix-epoch
 * ns.  Integer fields that the event does not carry hold INT64_MIN
 * (ST_NONE); string ids index the rank's string table.
 */
typedef struct st_event {
    int64_t ts;           /* ns */
    int64_t dur;          /* ns; 0 when absent (see ST_F_HAS_DUR) */
    int64_t pid;          /* integer pid, or a string id when ST_F_PID_STR */
    int64_t tid;          /* integer tid, or a string id when ST_F_TID_STR */
    int64_t id;           /* flow id (ph s/f), or a string id when ST_F_ID_STR */
    int64_t correlation;  /* args.correlation */
    int64_t external_id;  /* args["External id"] / args["external id"] */
    int64_t value;        /* args.bytes (memcpy/memset), args.sort_index (ph M) */
    uint32_t name;        /* string id of "name" */
    uint32_t cat;         /* string id of "cat" */
    uint32_t label;       /* ph M: args.name or args.labels; else ST_NOSTR */
    int32_t stream;       /* args.stream, or -1 */
    int32_t device;       /* args.device, or -1 */
    int32_t cbid;         /* args.cbid (CUDA) or args.cid (HIP), or -1 */
    uint8_t ph;           /* phase character: 'X', 'i', 's', 'f', 'M', ... (0 if absent) */
    uint8_t scope;        /* ph i: 's' scope character, else 0 */
    uint16_t flags;       /* ST_F_* */
    uint32_t reserved;    /* zero; keeps the record 8-byte aligned */
} st_event;

/* Kernel launch geometry, for events that carry any of it. */
typedef struct st_kernel {
    uint32_t event;               /* index of the event within its rank */
    int32_t grid[3];              /* -1 when absent */
    int32_t block[3];
    int32_t registers_per_thread;
    int32_t shared_memory;
    float blocks_per_sm;          /* NaN when absent */
    float warps_per_sm;
    float occupancy_pct;          /* args["est. achieved occupancy %"] */
} st_kernel;

/*
 * Communication arguments, for events that carry any comm key (kernels,
 * record_param_comms) and for nccl:* / record_param_comms / c10d:: ops that
 * carry Input Dims.  String-valued args are string ids; list-valued args that
 * are not strings (Input Dims, Input type) are stored as their raw JSON text.
 */
typedef struct st_comm {
    uint32_t event;
    uint32_t collective_name;
    uint32_t dtype;
    uint32_t pg_name;         /* "Process Group Name" */
    uint32_t pg_desc;         /* "Process Group Description" */
    uint32_t pg_ranks;        /* "Process Group Ranks" (a string holding a list) */
    uint32_t in_split;        /* "In split size" */
    uint32_t out_split;       /* "Out split size" */
    uint32_t input_dims;      /* raw JSON of "Input Dims" */
    uint32_t input_type;      /* raw JSON of "Input type" */
    uint32_t comms_id;        /* "Comms Id" as written (a uint64 hash: kept as text) */
    int64_t in_nelems;
    int64_t out_nelems;
    int64_t group_size;
    int64_t pg_id;            /* "Process Group ID" (older traces) */
    int64_t seq;              /* "Seq" */
    int64_t rank;             /* "Rank" */
    int32_t dst_rank;         /* "Dst Rank" (c10d send: the peer's global rank), -1 when absent */
    int32_t src_rank;         /* "Src Rank" (c10d recv: the peer's global rank), -1 when absent */
} st_comm;
/* CDEF END */

#define ST_NONE INT64_MIN

#endif
