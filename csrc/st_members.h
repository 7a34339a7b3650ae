/*
 * The top-level members of a trace other than traceEvents (deviceProperties,
 * distributedInfo, baseTimeNanoseconds, ...), copied as raw JSON text so they
 * outlive the caller's buffer.  Shared by the tokenizer and the fuse
 * rewriter; header-only, no state beyond the caller's st_members.
 */
#ifndef ST_MEMBERS_H
#define ST_MEMBERS_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *key;        /* raw JSON-escaped key, NUL-terminated */
    size_t key_len;
    char *value;      /* raw JSON text of the value, NUL-terminated */
    size_t value_len;
} st_member;

typedef struct {
    st_member *items;
    size_t n, cap;
} st_members;

/* Copy one member in; 0 on success, -1 when out of memory (nothing added). */
static inline int st_members_add(st_members *ms, const char *k, size_t kn, const char *v, size_t vn)
{
    if (ms->n == ms->cap) {
        size_t cap = ms->cap ? ms->cap * 2 : 16;
        st_member *items = realloc(ms->items, cap * sizeof *items);
        if (!items)
            return -1;
        ms->items = items;
        ms->cap = cap;
    }
    st_member *m = &ms->items[ms->n];
    m->key = malloc(kn + 1);
    m->value = malloc(vn + 1);
    if (!m->key || !m->value) {
        free(m->key);
        free(m->value);
        return -1;
    }
    if (kn)
        memcpy(m->key, k, kn);
    m->key[kn] = 0;
    if (vn)
        memcpy(m->value, v, vn);
    m->value[vn] = 0;
    m->key_len = kn;
    m->value_len = vn;
    ms->n++;
    return 0;
}

/* Member i; 0 on success, -1 when i is out of range. */
static inline int st_members_get(const st_members *ms, size_t i, const char **key, size_t *key_len,
                                 const char **value, size_t *value_len)
{
    if (i >= ms->n)
        return -1;
    *key = ms->items[i].key;
    *key_len = ms->items[i].key_len;
    *value = ms->items[i].value;
    *value_len = ms->items[i].value_len;
    return 0;
}

/* Forget the members (keeps the array for reuse). */
static inline void st_members_clear(st_members *ms)
{
    for (size_t i = 0; i < ms->n; i++) {
        free(ms->items[i].key);
        free(ms->items[i].value);
    }
    ms->n = 0;
}

static inline void st_members_free(st_members *ms)
{
    st_members_clear(ms);
    free(ms->items);
    ms->items = NULL;
    ms->cap = 0;
}

#endif
