/* Row selection by string class.  See st_select.h. */
#include "st_select.h"

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
