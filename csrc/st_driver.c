/*
 * Standalone driver for the C core, for sanitizer runs (make sanitize) and
 * profiling; not part of the Python package.
 *
 *   st_driver [-s SEED] [-c MAX_CHUNK] FILE...   tokenize (gzip sniffed) in
 *                                                pseudo-random chunk sizes,
 *                                                about half with drop_flows,
 *                                                about half with align_only
 *   st_driver -w ROUNDS                          random interval sweeps and
 *                                                report row writes checked
 *                                                against brute force
 * Every feed's n_meta is checked against st_tok_meta_count.
 * Every batch of records is also run through st_select, st_select_spans and st_gather,
 * checked against a plain loop.  Prints one line per file.  Exit 0 when every file was
 * tokenized or refused with an error code and every sweep and selection
 * agreed; 1 on a mismatch; 2 on usage errors.  Memory errors abort under AddressSanitizer/UBSan.
 */
#include "st_tokenizer.h"
#include "st_cells.h"
#include "st_select.h"
#include <stddef.h>
#include "st_sweep.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OUT_CAP 4096

static unsigned long long rng_state = 88172645463325252ull;
static size_t next_chunk(size_t max)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return 1 + (size_t)(rng_state % max);
}

static st_event events[OUT_CAP];
static st_kernel kernels[OUT_CAP];
static st_comm comms[OUT_CAP];
static int select_mismatches;
static int meta_mismatches; /* feeds whose out->n_meta differed from st_tok_meta_count */

/* st_select, st_select_spans and st_select_many on a batch of real records, with random class bits for the
 * strings seen so far (some ids left past the table) and a random rule,
 * against a plain loop; also run with a small cap, which must stop early. */
static void check_select(const st_event *ev, size_t n, uint32_t n_strings)
{
    enum { CLASSES = 4096 };
    static uint16_t cls[CLASSES];
    static int64_t got[OUT_CAP];
    size_t n_cls = n_strings < CLASSES ? n_strings : CLASSES;
    if (n_cls)
        n_cls -= next_chunk(n_cls) - 1;
    for (size_t i = 0; i < n_cls; i++)
        cls[i] = (uint16_t)next_chunk(0x10000);
    st_select_rule rule = {(uint16_t)next_chunk(0xFFFF), (uint16_t)(next_chunk(3) == 1 ? 0 : next_chunk(0xFFFF)),
                           (uint16_t)(next_chunk(2) == 1 ? 0 : ST_F_HAS_TS), (uint8_t)(next_chunk(2) == 1 ? 0 : 'X')};
    size_t m = st_select(ev, n, cls, n_cls, &rule, got, OUT_CAP), k = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t c = ev[i].cat < n_cls ? cls[ev[i].cat] : 0, nm = ev[i].name < n_cls ? cls[ev[i].name] : 0;
        int keep = (!rule.ph || ev[i].ph == rule.ph) && (ev[i].flags & rule.flags_all) == rule.flags_all &&
                   (c & rule.cat_any) && (!rule.name_any || (nm & rule.name_any));
        if (keep)
            select_mismatches += k >= m || got[k++] != (int64_t)i;
    }
    select_mismatches += k != m;
    static int64_t start[OUT_CAP], end[OUT_CAP], thread[OUT_CAP];
    static uint32_t name[OUT_CAP];
    select_mismatches += st_select_spans(ev, n, cls, n_cls, &rule, start, end, thread, name, OUT_CAP) != m;
    for (k = 0; k < m; k++) {
        const st_event *e = &ev[got[k]];
        select_mismatches += start[k] != e->ts || end[k] != (int64_t)((uint64_t)e->ts + (uint64_t)e->dur) ||
                             name[k] != e->name || thread[k] != ((e->flags & ST_F_TID_STR) ? -1 - e->tid : e->tid);
    }
    size_t cap = next_chunk(4) - 1;
    select_mismatches += st_select(ev, n, cls, n_cls, &rule, got, cap) != (m < cap ? m : cap);
    /* st_select_many: the same rule among others, each output bounded by cap */
    static int64_t many[3][OUT_CAP];
    int64_t *outs[3] = {many[0], many[1], many[2]};
    st_select_rule rules[3] = {{0xFFFF, 0, 0, 0}, rule, {(uint16_t)next_chunk(0xFFFF), 0, ST_F_HAS_TS, 'X'}};
    size_t counts[3];
    st_select_many(ev, n, cls, n_cls, rules, 3, outs, OUT_CAP, counts);
    select_mismatches += counts[1] != m;
    st_select(ev, n, cls, n_cls, &rule, got, OUT_CAP);
    for (k = 0; k < m; k++)
        select_mismatches += many[1][k] != got[k];
    st_select_many(ev, n, cls, n_cls, rules, 3, outs, cap, counts);
    select_mismatches += counts[1] != (m < cap ? m : cap) || counts[0] > cap || counts[2] > cap;
    /* st_gather of the selected rows: same-size copies, zero- and
     * sign-extension, a strided destination; then a row past the records
     * and a field past the record, which must write nothing */
    st_select(ev, n, cls, n_cls, &rule, got, OUT_CAP);
    static int64_t ts[OUT_CAP], name64[OUT_CAP], stream64[OUT_CAP];
    static uint16_t flags[2 * OUT_CAP];
    st_gather_field fields[4] = {
        {offsetof(st_event, ts), 8, ts, 8, 8, 1},
        {offsetof(st_event, name), 8, name64, 4, 8, 0},
        {offsetof(st_event, stream), 8, stream64, 4, 8, 1},
        {offsetof(st_event, flags), 4, flags, 2, 2, 0},
    };
    select_mismatches += st_gather(ev, n, sizeof *ev, got, m, fields, 4) != ST_GATHER_OK;
    for (k = 0; k < m; k++) {
        const st_event *e = &ev[got[k]];
        select_mismatches += ts[k] != e->ts || name64[k] != (int64_t)e->name || stream64[k] != (int64_t)e->stream
                             || flags[2 * k] != e->flags;
    }
    if (m) {
        int64_t keep = ts[0];
        got[m - 1] = (int64_t)n;
        select_mismatches += st_gather(ev, n, sizeof *ev, got, m, fields, 4) != ST_GATHER_BAD_ROW || ts[0] != keep;
        got[m - 1] = 0;
        st_gather_field past = {sizeof *ev - 4, 8, ts, 8, 8, 1};
        select_mismatches += st_gather(ev, n, sizeof *ev, got, m, &past, 1) != ST_GATHER_BAD_FIELD || ts[0] != keep;
    }
}

static int run_file(const char *path, size_t max_chunk)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    st_tok *tok;
    st_tok_options opts;
    memset(&opts, 0, sizeof opts);
    opts.drop_flows = (int)(next_chunk(2) == 1); /* about half the runs drop flow events */
    opts.align_only = (int)(next_chunk(2) == 1); /* and about half keep only what align reads */
    st_tok_create(&tok, &opts);
    st_inflate *inf = NULL;
    unsigned char head[2] = {0, 0};
    size_t got = fread(head, 1, 2, f);
    int gz = got == 2 && head[0] == 0x1f && head[1] == 0x8b;
    rewind(f);
    if (gz)
        st_inflate_create(&inf);

    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    unsigned char in[1 << 15];
    size_t in_len = 0, in_pos = 0;
    int eof = 0, rc = ST_OK;
    unsigned long long events_total = 0;
    st_tok_out out = {events, OUT_CAP, 0, kernels, OUT_CAP, 0, comms, OUT_CAP, 0, 0};
    for (;;) {
        /* fill buf with up to a random number of new bytes; when the last
         * feed consumed nothing (one item bigger than what is buffered), at
         * least double the buffered amount, as the Python side does */
        size_t want = next_chunk(max_chunk);
        if (len > want)
            want = len;
        if (len + want > cap) {
            while (len + want > cap)
                cap *= 2;
            buf = realloc(buf, cap);
        }
        size_t added = 0;
        while (added < want && !eof) {
            if (in_pos == in_len) {
                in_len = fread(in, 1, next_chunk(sizeof in), f);
                in_pos = 0;
                if (in_len == 0) {
                    eof = 1;
                    break;
                }
            }
            if (inf) {
                size_t used, made;
                int r = st_inflate_run(inf, in + in_pos, in_len - in_pos,
                                       (unsigned char *)buf + len + added, want - added, &used, &made);
                if (r < 0) {
                    printf("%s: inflate error: %s\n", path, st_inflate_error(inf));
                    goto cleanup;
                }
                in_pos += used;
                added += made;
                if (used == 0 && made == 0)
                    break;
            } else {
                size_t n = in_len - in_pos < want - added ? in_len - in_pos : want - added;
                memcpy(buf + len + added, in + in_pos, n);
                in_pos += n;
                added += n;
            }
        }
        len += added;
        for (;;) {
            size_t consumed;
            rc = st_tok_feed(tok, buf, len, eof, &out, &consumed);
            memmove(buf, buf + consumed, len - consumed);
            len -= consumed;
            check_select(events, out.n_events, st_tok_string_count(tok));
            if (out.n_meta != st_tok_meta_count(tok))
                meta_mismatches++;
            st_tok_meta_clear(tok);
            events_total += out.n_events;
            out.n_events = out.n_kernels = out.n_comms = 0;
            if (rc != ST_OUTPUT_FULL)
                break;
        }
        if (rc < 0 || rc == ST_DONE || rc == ST_TRUNCATED)
            break;
    }
    if (rc < 0)
        printf("%s: error %d at byte %llu: %s\n", path, rc,
               (unsigned long long)st_tok_error_offset(tok), st_tok_error(tok));
    else
        printf("%s: status %d, %llu events, %u strings\n", path, rc, events_total,
               st_tok_string_count(tok));
cleanup:
    free(buf);
    st_inflate_destroy(inf);
    st_tok_destroy(tok);
    fclose(f);
    return 0;
}

static int64_t rnd(int64_t lo, int64_t hi) { return lo + (int64_t)next_chunk((size_t)(hi - lo + 1)) - 1; }

static int cmp_start(const void *a, const void *b)
{
    const int64_t *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

/* Random interval sets: st_union / st_overlap_with_union / st_meeting_union / st_pairs against
 * brute force.  Returns the number of mismatches. */
static int check_sweeps(int rounds)
{
    enum { N = 64 };
    int bad = 0;
    for (int round = 0; round < rounds; round++) {
        int64_t b[N][2], bs[N], be[N], us[N], ue[N], qs[N], qe[N], ov[N];
        int64_t pa[N * N], pb[N * N], pl[N * N], pmax[N];
        size_t nb = (size_t)rnd(0, N - 1), nq = (size_t)rnd(0, N - 1), nu;
        for (size_t i = 0; i < nb; i++) {
            b[i][0] = rnd(0, 1000);
            b[i][1] = b[i][0] + rnd(-5, 100);
        }
        qsort(b, nb, sizeof b[0], cmp_start);
        for (size_t i = 0; i < nb; i++) {
            bs[i] = b[i][0];
            be[i] = b[i][1];
        }
        for (size_t i = 0; i < nq; i++) {
            qs[i] = rnd(0, 1000);
            qe[i] = qs[i] + rnd(0, 200);
        }
        st_union(bs, be, nb, us, ue, &nu);
        st_overlap_with_union(qs, qe, nq, us, ue, nu, ov);
        int64_t meet[N];
        size_t n_meet, k_meet = 0;
        st_meeting_union(qs, qe, nq, us, ue, nu, meet, &n_meet);
        for (size_t i = 0; i < nq; i++) {
            int meets = 0;
            for (size_t j = 0; j < nu; j++)
                meets |= us[j] < qe[i] && ue[j] > qs[i];
            if (meets)
                bad += k_meet >= n_meet || meet[k_meet++] != (int64_t)i;
        }
        bad += k_meet != n_meet;
        st_prefix_max(bs, be, nb, pmax);
        size_t a_pos = 0, b_pos = 0, np = 0;
        while (a_pos < nq) /* tiny capacity: exercises resumption */
            np += st_pairs(qs, qe, nq, bs, be, pmax, nb, pa + np, pb + np, pl + np, 3, &a_pos, &b_pos);
        for (size_t i = 0; i < nq; i++) {
            int64_t covered = 0, pair_total = 0;
            for (int64_t t = qs[i]; t < qe[i]; t++) {
                int in = 0;
                for (size_t j = 0; j < nb && !in; j++)
                    in = bs[j] <= t && t < be[j];
                covered += in;
            }
            bad += covered != ov[i];
            for (size_t j = 0; j < nb; j++) {
                int64_t lo = bs[j] > qs[i] ? bs[j] : qs[i], hi = be[j] < qe[i] ? be[j] : qe[i];
                if (hi > lo)
                    pair_total += hi - lo;
            }
            for (size_t k = 0; k < np; k++)
                if (pa[k] == (int64_t)i)
                    pair_total -= pl[k];
            bad += pair_total != 0;
        }
    }
    printf("sweeps: %d rounds, %d mismatches\n", rounds, bad);
    return bad;
}

static int cmp_i64_asc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* correlate's sweeps (st_factorize_rows, st_window_medians, st_innermost)
 * against brute force.  Returns the number of mismatches. */
static int check_correlate_sweeps(int rounds)
{
    enum { N = 48, Q = 6 };
    int bad = 0;
    for (int round = 0; round < rounds; round++) {
        /* factorize: equal rows <=> equal codes, numbered by first appearance */
        int64_t rows[N * 3], table[256], codes[N], first[N];
        size_t n = (size_t)rnd(0, N), width = (size_t)rnd(1, 3), m;
        for (size_t i = 0; i < n * width; i++)
            rows[i] = rnd(-1, 2);
        if (st_factorize_rows(rows, n, width, table, 256, codes, first, &m) != ST_SWEEP_OK)
            bad++;
        int64_t next = 0;
        for (size_t i = 0; i < n; i++) {
            if (codes[i] == next)
                bad += first[next++] != (int64_t)i;
            else
                bad += codes[i] > next || first[codes[i]] >= (int64_t)i;
            for (size_t j = 0; j < i; j++)
                bad += (memcmp(rows + i * width, rows + j * width, width * sizeof rows[0]) == 0)
                       != (codes[i] == codes[j]);
        }
        bad += (size_t)next != m;

        /* kernels sorted by start, with codes 0..3 */
        int64_t ks[N], ke[N], kc[N];
        size_t nk = (size_t)rnd(1, N);
        for (size_t i = 0; i < nk; i++)
            ks[i] = rnd(0, 300);
        qsort(ks, nk, sizeof ks[0], cmp_i64_asc);
        for (size_t i = 0; i < nk; i++) {
            ke[i] = ks[i] + rnd(0, 60);
            kc[i] = rnd(0, 3);
        }
        int64_t q_lo[Q], q_hi[Q], q_t[Q], ref_ptr[Q + 1], r_lo[Q * 3], r_hi[Q * 3], r_t[Q * 3];
        size_t nq = (size_t)rnd(0, Q), nr = 0;
        ref_ptr[0] = 0;
        for (size_t q = 0; q < nq; q++) {
            q_lo[q] = rnd(0, (int64_t)nk);
            q_hi[q] = rnd(q_lo[q], (int64_t)nk);
            q_t[q] = rnd(-10, 300);
            for (int r = (int)rnd(0, 3); r > 0; r--, nr++) {
                r_lo[nr] = rnd(0, (int64_t)nk);
                r_hi[nr] = rnd(r_lo[nr], (int64_t)nk);
                r_t[nr] = rnd(-10, 300);
            }
            ref_ptr[q + 1] = (int64_t)nr;
        }
        int64_t count[4] = {0}, slot[4], bucket[N * 3], touched[N], out_k[N * Q], out_ptr[Q + 1];
        double med[4], out_m[N * Q];
        if (st_window_medians(ks, ke, kc, nk, 4, q_lo, q_hi, q_t, nq, ref_ptr, r_lo, r_hi, r_t, nr, count, slot, med,
                              bucket, N * 3, touched, N, out_k, out_m, N * Q, out_ptr) != ST_SWEEP_OK)
            bad++;
        else
            for (size_t q = 0; q < nq; q++) {
                int64_t k = out_ptr[q];
                for (int64_t j = q_lo[q]; j < q_hi[q]; j++) {
                    if (ke[j] <= q_t[q])
                        continue;
                    int64_t d[N * 3];
                    size_t nd = 0;
                    for (int64_t r = ref_ptr[q]; r < ref_ptr[q + 1]; r++)
                        for (int64_t i = r_lo[r]; i < r_hi[r]; i++)
                            if (ke[i] > r_t[r] && kc[i] == kc[j])
                                d[nd++] = ke[i] - ks[i];
                    qsort(d, nd, sizeof d[0], cmp_i64_asc);
                    double want = nd == 0 ? NAN : nd % 2 ? (double)d[nd / 2]
                                                         : ((double)d[nd / 2 - 1] + (double)d[nd / 2]) / 2.0;
                    bad += out_k[k] != j || (nd ? out_m[k] != want : !isnan(out_m[k]));
                    k++;
                }
                bad += k != out_ptr[q + 1];
            }
        for (int c = 0; c < 4; c++)
            bad += count[c] != 0;

        /* innermost self time: per window, each point to the covering interval
         * of least (duration, index) */
        int64_t qa[Q], qb[Q], lo[Q], hi[Q], sel[N], heap[N], acc[2 * N], cuts[2 * N + 2];
        int64_t oq[N * Q], oi[N * Q], os[N * Q], of[N * Q];
        size_t no;
        for (size_t q = 0; q < nq; q++) {
            qa[q] = rnd(0, (int64_t)nk);
            qb[q] = rnd(qa[q], (int64_t)nk);
            lo[q] = rnd(0, 300);
            hi[q] = lo[q] + rnd(-5, 80);
        }
        if (st_innermost(ks, ke, nk, qa, qb, lo, hi, nq, sel, heap, acc, cuts, N, oq, oi, os, of, N * Q, &no)
            != ST_SWEEP_OK) {
            bad++;
            continue;
        }
        for (size_t q = 0; q < nq; q++) {
            int64_t self[N] = {0}, first_x[N];
            for (int64_t x = lo[q]; x < hi[q]; x++) {
                int64_t best = -1;
                for (int64_t i = qa[q]; i < qb[q]; i++) {
                    if (ke[i] <= lo[q] || !(ks[i] <= x && ke[i] > x))
                        continue;
                    if (best < 0 || ke[i] - ks[i] < ke[best] - ks[best])
                        best = i;
                }
                if (best >= 0 && !self[best]++)
                    first_x[best] = x;
            }
            for (size_t k = 0; k < no; k++)
                if (oq[k] == (int64_t)q) {
                    bad += os[k] != self[oi[k]] || of[k] != first_x[oi[k]];
                    self[oi[k]] = 0;
                }
            for (size_t i = 0; i < nk; i++)
                bad += self[i] != 0;
        }
    }
    printf("correlate sweeps: %d rounds, %d mismatches\n", rounds, bad);
    return bad;
}

/* The text of number v (scale 0 or 3) by snprintf: the reference for st_format_rows. */
static size_t reference_number(char *p, int64_t v, int scale)
{
    if (scale == 0)
        return (size_t)sprintf(p, "%lld", (long long)v);
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    int n = sprintf(p, "%s%llu.%03u", v < 0 ? "-" : "", (unsigned long long)(u / 1000), (unsigned)(u % 1000));
    while (p[n - 1] == '0' && p[n - 2] != '.')
        n--;
    return (size_t)n;
}

/* Random tables written by st_format_rows into buffers of random sizes,
 * piece after piece, against rows built with snprintf; then broken columns
 * (codes past the table, offsets out of order, a bad scale), which must be
 * refused. */
static int check_cells(int rounds)
{
    enum { ROWS = 64, COLS = 4, TEXTS = 3, OUT = 1 << 14 };
    static int64_t values[COLS][ROWS];
    static int32_t codes[COLS][ROWS];
    static int64_t offs[COLS][TEXTS + 1];
    static char expect[OUT], got[OUT];
    static const int64_t edge[] = {0, -1, 1, 999, -1000, 1001, INT64_MAX, INT64_MIN, 1000000000000000ll};
    const char table[] = "ab\",x<y>";
    int bad = 0;
    for (int round = 0; round < rounds; round++) {
        size_t n_rows = (size_t)rnd(0, ROWS), n_cols = (size_t)rnd(1, COLS);
        st_cell_column cols[COLS];
        for (size_t k = 0; k < n_cols; k++) {
            int numbers = (int)rnd(0, 1);
            size_t n_texts = (size_t)rnd(numbers ? 0 : 1, TEXTS);
            offs[k][0] = 0;
            for (size_t j = 0; j < n_texts; j++)
                offs[k][j + 1] = rnd(offs[k][j], (int64_t)sizeof table - 1);
            for (size_t r = 0; r < n_rows; r++) {
                values[k][r] = rnd(0, 3) ? rnd(-2000000, 2000000) : edge[rnd(0, sizeof edge / sizeof *edge - 1)];
                codes[k][r] = (int32_t)rnd(numbers ? -1 : 0, (int64_t)n_texts - 1);
            }
            cols[k] = (st_cell_column){numbers ? values[k] : NULL, n_texts ? codes[k] : NULL, rnd(0, 1) ? 3 : 0,
                                       table, sizeof table - 1, offs[k], n_texts};
        }
        st_row_format fmt = {",", 1, "<r>", 3, "\n", 1, "[", 1, "]", 1};
        size_t m = 0;
        for (size_t r = 0; r < n_rows; r++) {
            m += (size_t)sprintf(expect + m, "<r>");
            for (size_t k = 0; k < n_cols; k++) {
                if (k)
                    expect[m++] = ',';
                int32_t code = cols[k].codes ? codes[k][r] : -1;
                if (code >= 0) {
                    size_t len = (size_t)(offs[k][code + 1] - offs[k][code]);
                    memcpy(expect + m, table + offs[k][code], len);
                    m += len;
                } else {
                    expect[m++] = '[';
                    m += reference_number(expect + m, values[k][r], cols[k].scale);
                    expect[m++] = ']';
                }
            }
            expect[m++] = '\n';
        }
        size_t cap = (size_t)rnd(1, 200), done = 0, g = 0;
        while (done < n_rows) {
            size_t used = 0;
            int64_t rows = st_format_rows(cols, n_cols, done, n_rows, &fmt, got + g, cap, &used);
            if (rows < 0 || used > cap) {
                bad++;
                break;
            }
            if (rows == 0)
                cap *= 2;
            done += (size_t)rows;
            g += used;
        }
        if (g != m || memcmp(got, expect, m) != 0)
            bad++;
        /* broken columns: refused with the right code, nothing written past the buffer */
        if (n_rows && cols[0].codes) {
            int32_t saved = codes[0][0];
            codes[0][0] = (int32_t)cols[0].table_n;
            size_t used = 0;
            if (st_format_rows(cols, n_cols, 0, n_rows, &fmt, got, OUT, &used) != ST_CELLS_BAD_CODE || used)
                bad++;
            codes[0][0] = saved;
        }
        if (cols[0].table_n) {
            int64_t saved = offs[0][cols[0].table_n];
            offs[0][cols[0].table_n] = (int64_t)sizeof table + 5;
            size_t used = 0;
            if (st_format_rows(cols, n_cols, 0, n_rows, &fmt, got, OUT, &used) != ST_CELLS_BAD_TABLE)
                bad++;
            offs[0][cols[0].table_n] = saved;
        }
        cols[0].scale = 2;
        size_t used = 0;
        if (st_format_rows(cols, n_cols, 0, n_rows, &fmt, got, OUT, &used) != ST_CELLS_BAD_SCALE)
            bad++;
    }
    printf("cells: %d rounds, %d mismatches\n", rounds, bad);
    return bad;
}

int main(int argc, char **argv)
{
    size_t max_chunk = 1 << 16;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "-s") == 0 && i + 1 < argc)
            rng_state = strtoull(argv[++i], NULL, 10) | 1;
        else if (strcmp(argv[i], "-c") == 0 && i + 1 < argc)
            max_chunk = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "-w") == 0 && i + 1 < argc)
        {
            int rounds = atoi(argv[++i]);
            return check_sweeps(rounds) + check_correlate_sweeps(rounds) + check_cells(rounds) ? 1 : 0;
        }
        else {
            fprintf(stderr, "usage: st_driver [-s SEED] [-c MAX_CHUNK] FILE... | st_driver -w ROUNDS\n");
            return 2;
        }
    }
    if (max_chunk == 0)
        max_chunk = 1;
    for (; i < argc; i++)
        run_file(argv[i], max_chunk);
    if (select_mismatches) {
        printf("st_select: %d mismatches against the plain loop\n", select_mismatches);
        return 1;
    }
    if (meta_mismatches) {
        printf("st_tok_feed: %d feeds reported a wrong n_meta\n", meta_mismatches);
        return 1;
    }
    return 0;
}
