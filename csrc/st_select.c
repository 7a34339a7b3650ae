/* Row selection by string class.  See st_select.h. */
#include "st_select.h"

static uint16_t class_of(const uint16_t *cls, size_t n_cls, uint32_t id)
{
    return id < n_cls ? cls[id] : 0;
}

size_t st_select(const st_event *ev, size_t n, const uint16_t *cls, size_t n_cls,
                 const st_select_rule *rule, int64_t *out, size_t cap)
{
    size_t m = 0;
    for (size_t i = 0; i < n && m < cap; i++) {
        const st_event *e = &ev[i];
        if (rule->ph && e->ph != rule->ph)
            continue;
        if ((e->flags & rule->flags_all) != rule->flags_all)
            continue;
        if (!(class_of(cls, n_cls, e->cat) & rule->cat_any))
            continue;
        if (rule->name_any && !(class_of(cls, n_cls, e->name) & rule->name_any))
            continue;
        out[m++] = (int64_t)i;
    }
    return m;
}
