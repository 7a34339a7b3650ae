/* Row selection by string class, and gathering the rows kept.  See st_select.h. */
#include "st_select.h"

#include <string.h>

static uint16_t class_of(const uint16_t *cls, size_t n_cls, uint32_t id)
{
    return id < n_cls ? cls[id] : 0;
}

static int meets(const st_event *e, const uint16_t *cls, size_t n_cls, const st_select_rule *rule)
{
    if (rule->ph && e->ph != rule->ph)
        return 0;
    if ((e->flags & rule->flags_all) != rule->flags_all)
        return 0;
    if (!(class_of(cls, n_cls, e->cat) & rule->cat_any))
        return 0;
    return !rule->name_any || (class_of(cls, n_cls, e->name) & rule->name_any);
}

size_t st_select(const st_event *ev, size_t n, const uint16_t *cls, size_t n_cls,
                 const st_select_rule *rule, int64_t *out, size_t cap)
{
    size_t m = 0;
    for (size_t i = 0; i < n && m < cap; i++)
        if (meets(&ev[i], cls, n_cls, rule))
            out[m++] = (int64_t)i;
    return m;
}

void st_select_many(const st_event *ev, size_t n, const uint16_t *cls, size_t n_cls,
                    const st_select_rule *rules, size_t n_rules, int64_t *const *out, size_t cap,
                    size_t *counts)
{
    for (size_t k = 0; k < n_rules; k++)
        counts[k] = 0;
    for (size_t i = 0; i < n; i++) {
        const st_event *e = &ev[i];
        uint16_t cat = class_of(cls, n_cls, e->cat), name = class_of(cls, n_cls, e->name);
        for (size_t k = 0; k < n_rules; k++) {
            const st_select_rule *r = &rules[k];
            if ((r->ph && e->ph != r->ph) || (e->flags & r->flags_all) != r->flags_all || !(cat & r->cat_any)
                || (r->name_any && !(name & r->name_any)) || counts[k] >= cap)
                continue;
            out[k][counts[k]++] = (int64_t)i;
        }
    }
}

size_t st_select_spans(const st_event *ev, size_t n, const uint16_t *cls, size_t n_cls,
                       const st_select_rule *rule, int64_t *start, int64_t *end, int64_t *thread,
                       uint32_t *name, size_t cap)
{
    size_t m = 0;
    for (size_t i = 0; i < n && m < cap; i++) {
        const st_event *e = &ev[i];
        if (!meets(e, cls, n_cls, rule))
            continue;
        start[m] = e->ts;
        /* wrapping add, as numpy's: values from the tokenizer never overflow */
        end[m] = (int64_t)((uint64_t)e->ts + (uint64_t)e->dur);
        thread[m] = (e->flags & ST_F_TID_STR) ? -1 - e->tid : e->tid;
        name[m] = e->name;
        m++;
    }
    return m;
}

static int valid_size(uint8_t size)
{
    return size == 1 || size == 2 || size == 4 || size == 8;
}

static int64_t read_int(const unsigned char *p, uint8_t size, uint8_t is_signed)
{
    switch (size) {
    case 1: {
        uint8_t v;
        memcpy(&v, p, 1);
        return is_signed ? (int64_t)(int8_t)v : (int64_t)v;
    }
    case 2: {
        uint16_t v;
        memcpy(&v, p, 2);
        return is_signed ? (int64_t)(int16_t)v : (int64_t)v;
    }
    case 4: {
        uint32_t v;
        memcpy(&v, p, 4);
        return is_signed ? (int64_t)(int32_t)v : (int64_t)v;
    }
    default: {
        int64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    }
}

static void write_int(unsigned char *p, uint8_t size, int64_t value)
{
    /* truncation to the low bytes: a same-size copy keeps the bit pattern */
    uint64_t v = (uint64_t)value;
    switch (size) {
    case 1: {
        uint8_t x = (uint8_t)v;
        memcpy(p, &x, 1);
        break;
    }
    case 2: {
        uint16_t x = (uint16_t)v;
        memcpy(p, &x, 2);
        break;
    }
    case 4: {
        uint32_t x = (uint32_t)v;
        memcpy(p, &x, 4);
        break;
    }
    default:
        memcpy(p, &v, 8);
    }
}

int st_gather(const void *rec, size_t n_rec, size_t rec_size, const int64_t *rows, size_t n_rows,
              const st_gather_field *fields, size_t n_fields)
{
    for (size_t f = 0; f < n_fields; f++) {
        const st_gather_field *g = &fields[f];
        if (!valid_size(g->src_size) || !valid_size(g->dst_size) || g->dst_size < g->src_size
            || g->src_off > rec_size || rec_size - g->src_off < g->src_size || (n_rows && !g->dst))
            return ST_GATHER_BAD_FIELD;
    }
    for (size_t k = 0; k < n_rows; k++)
        if (rows[k] < 0 || (uint64_t)rows[k] >= n_rec)
            return ST_GATHER_BAD_ROW;
    const unsigned char *base = rec;
    for (size_t k = 0; k < n_rows; k++) {
        const unsigned char *r = base + (size_t)rows[k] * rec_size;
        for (size_t f = 0; f < n_fields; f++) {
            const st_gather_field *g = &fields[f];
            write_int((unsigned char *)g->dst + k * g->dst_stride, g->dst_size,
                      read_int(r + g->src_off, g->src_size, g->src_signed));
        }
    }
    return ST_GATHER_OK;
}
