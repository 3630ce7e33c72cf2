// A Zipline transform in C: drops the configured tables and replaces the configured columns
// by a hash (64-bit FNV-1a, 16 lower-case hex digits).
//
// Config (the route's `transform.config` map):
//   drop  comma-separated tables whose changes are dropped: `schema.table`, or a bare
//         `table` for any schema
//   hash  comma-separated column names (in every table) whose values are hashed
//
// A hashed `text` becomes the hex digits of the hash of its UTF-8 bytes; `other` values are
// hashed the same way (their text form); `bytes` become the 8 bytes of the hash, big-endian.
// Every other variant (NULL, numbers, dates, `unchanged`, ...) passes as it is: a hash of a
// number would no longer fit its column. A hashed key column is hashed in `key` and
// `old-key` too, so updates and deletes still find the row the insert wrote.
//
// The batch (zipline:transform@0.3.0) is four flat lists: `tables`, `data` (the bytes of every
// text, bytea, ... value), `values` (every value of every change; a text value is a span of
// `data`) and `changes` (whose key, old key and row are spans of `values`). The output is
// built from the input with as little copying as the contract allows:
//   - `tables` and `values` are the input's own lists, handed over: a change that is kept
//     keeps its spans, and a value that is not hashed keeps its span into the input's data;
//   - a hashed value's entry in `values` is overwritten in place with a span of new bytes;
//   - `output.data` holds only those new bytes (the hashes). Its spans count on from the end
//     of the input's data: the first new byte is at `batch->data.len`, not at 0;
//   - `changes` is the input's list with the dropped changes squeezed out.
//
// Memory: the bindings (gen/transform.c) hand us the batch in memory we own: what we do not
// return we must free. What we return is freed by the bindings' post-return function
// (`cabi_post_transform`) after the host has copied it, so it must come from malloc (or be
// the input's own lists, which do). Both the post-return and the generated `_free` helpers
// free a list only when its `len > 0`: an empty list's pointer is not an allocation (the
// canonical ABI passes a dummy), so returning a list of ours with its len cut to 0 would leak
// it. When every change is dropped we free the whole batch instead and return empty lists.
//
// No <stdio.h>: printf and friends pull in WASI file imports, and a transform must import
// nothing but `host`. Messages are built with the small `buf_*` helpers below.

#include <stdlib.h>
#include <string.h>

#include "gen/transform.h"

typedef zipline_transform_types_value_t value_t;
typedef zipline_transform_types_change_t change_t;
typedef zipline_transform_types_table_t table_t;
typedef zipline_transform_types_span_t span_t;

// Config: each list is one malloc'd copy of the config value with its commas turned into
// NULs, plus pointers to the pieces. 64 entries is far more than a route needs; more is an
// init error rather than a silent truncation.
#define MAX_ITEMS 64
typedef struct {
  char *buf;
  const char *items[MAX_ITEMS];
  size_t len;
} name_list_t;

static name_list_t DROP;
static name_list_t HASH;
static bool READY;

// A bounded string builder: appends past the end are cut, never overflow.
typedef struct {
  char data[256];
  size_t len;
} buf_t;

static void buf_mem(buf_t *b, const void *p, size_t n) {
  size_t room = sizeof b->data - 1 - b->len;
  if (n > room) n = room;
  memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = '\0';
}

static void buf_str(buf_t *b, const char *s) { buf_mem(b, s, strlen(s)); }

static void buf_uint(buf_t *b, uint64_t v) {
  char digits[20];
  size_t n = 0;
  do {
    digits[sizeof digits - 1 - n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  buf_mem(b, digits + sizeof digits - n, n);
}

static void set_err(transform_string_t *err, const char *msg) { transform_string_dup(err, msg); }

static void log_line(zipline_transform_host_level_t level, const char *msg) {
  transform_string_t s;
  transform_string_set(&s, msg);
  zipline_transform_host_log(level, &s);
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Splits `value` (not NUL-terminated) on commas into `out`, trimming blanks, skipping empty
// items. False when there are more than MAX_ITEMS.
static bool parse_list(const transform_string_t *value, name_list_t *out) {
  free(out->buf);
  out->len = 0;
  out->buf = malloc(value->len + 1);
  if (!out->buf) abort();
  memcpy(out->buf, value->ptr, value->len);
  out->buf[value->len] = '\0';
  char *p = out->buf;
  while (*p) {
    char *comma = strchr(p, ',');
    char *end = comma ? comma : p + strlen(p);
    char *next = comma ? comma + 1 : end;
    while (p < end && is_space(*p)) p++;
    while (end > p && is_space(end[-1])) end--;
    *end = '\0';
    if (p < end) {
      if (out->len == MAX_ITEMS) return false;
      out->items[out->len++] = p;
    }
    p = next;
  }
  return true;
}

static bool str_eq(const transform_string_t *s, const char *c) {
  size_t n = strlen(c);
  return s->len == n && memcmp(s->ptr, c, n) == 0;
}

// True if the table is named by an entry of `list` (`schema.table` or a bare `table`).
static bool table_listed(const name_list_t *list, const table_t *t) {
  for (size_t i = 0; i < list->len; i++) {
    const char *item = list->items[i];
    const char *dot = strchr(item, '.');
    if (!dot) {
      if (str_eq(&t->name, item)) return true;
      continue;
    }
    size_t schema_len = (size_t)(dot - item);
    if (t->schema.len == schema_len && memcmp(t->schema.ptr, item, schema_len) == 0 &&
        str_eq(&t->name, dot + 1))
      return true;
  }
  return false;
}

static bool name_listed(const name_list_t *list, const transform_string_t *name) {
  for (size_t i = 0; i < list->len; i++)
    if (str_eq(name, list->items[i])) return true;
  return false;
}

bool exports_transform_init(transform_list_tuple2_string_string_t *config, transform_string_t *err) {
  bool ok = true;
  buf_t msg = {0};
  for (size_t i = 0; i < config->len && ok; i++) {
    const transform_string_t *key = &config->ptr[i].f0;
    const transform_string_t *value = &config->ptr[i].f1;
    name_list_t *list = str_eq(key, "drop") ? &DROP : str_eq(key, "hash") ? &HASH : NULL;
    if (!list) {
      buf_str(&msg, "unknown config key `");
      buf_mem(&msg, key->ptr, key->len);
      buf_str(&msg, "`; expected drop, hash");
      ok = false;
    } else if (!parse_list(value, list)) {
      buf_str(&msg, "config key `");
      buf_mem(&msg, key->ptr, key->len);
      buf_str(&msg, "` lists more than ");
      buf_uint(&msg, MAX_ITEMS);
      buf_str(&msg, " names");
      ok = false;
    }
  }
  transform_list_tuple2_string_string_free(config);
  if (!ok) {
    set_err(err, msg.data);
    return false;
  }
  buf_str(&msg, "c-drop-hash: dropping ");
  buf_uint(&msg, DROP.len);
  buf_str(&msg, " table(s), hashing ");
  buf_uint(&msg, HASH.len);
  buf_str(&msg, " column(s)");
  log_line(ZIPLINE_TRANSFORM_HOST_LEVEL_INFO, msg.data);
  READY = true;
  return true;
}

static uint64_t fnv1a64(const uint8_t *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

// The data span a hashable value points at, or NULL for a variant that is never hashed.
static span_t *hashed_span(value_t *v) {
  switch (v->tag) {
    case ZIPLINE_TRANSFORM_TYPES_VALUE_TEXT:
      return &v->val.text;
    case ZIPLINE_TRANSFORM_TYPES_VALUE_OTHER:
      return &v->val.other.text;
    case ZIPLINE_TRANSFORM_TYPES_VALUE_BYTES:
      return &v->val.bytes;
    default:
      // NULL, `unchanged`, numbers, temporal values, uuid, numeric, json: kept as they are.
      return NULL;
  }
}

// How many new bytes hashing `v` appends: 8 raw bytes for bytea, 16 hex digits otherwise.
static uint32_t hash_size(const value_t *v) {
  return v->tag == ZIPLINE_TRANSFORM_TYPES_VALUE_BYTES ? 8 : 16;
}

// What to do with one input table's changes: drop them, or hash which columns.
typedef struct {
  uint32_t column;     // index in the row (`values` span)
  int32_t key_index;   // index among the key columns (`key` / `old-key` span), or -1
} hashed_column_t;

typedef struct {
  bool drop;
  hashed_column_t *hashed;  // the table's columns named in `hash`
  size_t nhashed;
} plan_t;

static plan_t *plan_tables(const zipline_transform_types_list_table_t *tables) {
  plan_t *plans = calloc(tables->len ? tables->len : 1, sizeof *plans);
  if (!plans) abort();
  for (size_t t = 0; t < tables->len; t++) {
    const table_t *table = &tables->ptr[t];
    plan_t *p = &plans[t];
    p->drop = table_listed(&DROP, table);
    if (p->drop || !HASH.len) continue;
    int32_t k = 0;
    for (size_t c = 0; c < table->columns.len; c++) {
      const zipline_transform_types_column_t *col = &table->columns.ptr[c];
      int32_t key_index = col->is_key ? k++ : -1;
      if (!name_listed(&HASH, &col->name)) continue;
      if (!p->hashed) {
        p->hashed = malloc(table->columns.len * sizeof *p->hashed);
        if (!p->hashed) abort();
      }
      p->hashed[p->nhashed++] = (hashed_column_t){(uint32_t)c, key_index};
    }
  }
  return plans;
}

static void free_plans(plan_t *plans, size_t n) {
  for (size_t t = 0; t < n; t++) free(plans[t].hashed);
  free(plans);
}

// One transform call's state while it marks the values to hash.
typedef struct {
  const transform_batch_t *batch;
  // Per entry of `batch->values`: to be hashed? An entry is hashed once, however many spans
  // reach it (the host gives key, old key and row entries of their own, but a span that
  // overlaps another must not have its value hashed twice).
  uint8_t *marked;
  uint64_t new_bytes;  // what the marked values will append to `output.data`
  buf_t *msg;          // why the batch was refused
} marker_t;

static bool span_fits(span_t s, size_t n) { return (uint64_t)s.start + s.len <= n; }

static bool bad_span(marker_t *m, size_t change, const char *what, span_t s) {
  buf_str(m->msg, "change ");
  buf_uint(m->msg, change);
  buf_str(m->msg, ": ");
  buf_str(m->msg, what);
  buf_str(m->msg, " span ");
  buf_uint(m->msg, s.start);
  buf_str(m->msg, "+");
  buf_uint(m->msg, s.len);
  buf_str(m->msg, " is out of range");
  return false;
}

// Marks entry `index` of `span` (of change `change`) for hashing when it holds a hashable
// variant. Checks that the span lies in `values` and the value's bytes in `data`, so the C
// below never reads out of bounds, whatever the batch says.
static bool mark(marker_t *m, size_t change, const char *what, span_t span, size_t index) {
  if (!span_fits(span, m->batch->values.len)) return bad_span(m, change, what, span);
  if (index >= span.len) return true;  // a short row or key: nothing there to hash
  size_t v = span.start + index;
  value_t *value = &m->batch->values.ptr[v];
  span_t *bytes = hashed_span(value);
  if (!bytes || m->marked[v]) return true;
  if (!span_fits(*bytes, m->batch->data.len)) return bad_span(m, change, "data", *bytes);
  m->marked[v] = 1;
  m->new_bytes += hash_size(value);
  return true;
}

static bool mark_change(marker_t *m, const plan_t *p, size_t i, const change_t *ch) {
  for (size_t h = 0; h < p->nhashed; h++) {
    const hashed_column_t *col = &p->hashed[h];
    if (!mark(m, i, "values", ch->values, col->column)) return false;
    if (col->key_index < 0) continue;
    if (!mark(m, i, "key", ch->key, (size_t)col->key_index)) return false;
    if (ch->old_key.is_some && !mark(m, i, "old-key", ch->old_key.val, (size_t)col->key_index))
      return false;
  }
  return true;
}

// Appends the hash of `v`'s bytes to `out` and points `v` at them. `base` is the input data's
// length: output spans count on from there.
static void hash_value(value_t *v, const uint8_t *data, uint32_t base, transform_list_u8_t *out) {
  static const char digits[] = "0123456789abcdef";
  span_t *span = hashed_span(v);
  uint64_t h = fnv1a64(data + span->start, span->len);
  uint8_t *dst = out->ptr + out->len;
  uint32_t n = hash_size(v);
  if (v->tag == ZIPLINE_TRANSFORM_TYPES_VALUE_BYTES) {
    for (uint32_t i = 0; i < n; i++) dst[i] = (uint8_t)(h >> (56 - 8 * i));
  } else {
    for (uint32_t i = 0; i < n; i++) dst[i] = (uint8_t)digits[(h >> (60 - 4 * i)) & 0xf];
  }
  *span = (span_t){base + (uint32_t)out->len, n};
  out->len += n;
}

static bool refuse(transform_batch_t *batch, transform_string_t *err, const char *msg) {
  transform_batch_free(batch);
  set_err(err, msg);
  return false;
}

bool exports_transform_transform(transform_batch_t *batch, transform_output_t *ret,
                                 transform_string_t *err) {
  if (!READY) return refuse(batch, err, "transform called before init");
  size_t ntables = batch->tables.len;
  size_t nchanges = batch->changes.len;
  buf_t msg = {0};
  for (size_t i = 0; i < nchanges; i++) {
    uint32_t t = batch->changes.ptr[i].table;
    if (t >= ntables) {
      buf_str(&msg, "change ");
      buf_uint(&msg, i);
      buf_str(&msg, " refers to table #");
      buf_uint(&msg, t);
      buf_str(&msg, " of ");
      buf_uint(&msg, ntables);
      return refuse(batch, err, msg.data);
    }
  }
  plan_t *plans = plan_tables(&batch->tables);

  // Pass 1: squeeze the dropped changes out, mark the values of the kept ones to hash and
  // count the bytes their hashes take, so `output.data` is allocated once, at its final
  // size. Values are not touched yet, so a bad span can still refuse the batch. A change owns
  // no memory (its key and row are spans), so a dropped one needs no freeing: kept changes
  // just slide down over it.
  marker_t m = {batch, calloc(batch->values.len ? batch->values.len : 1, 1), 0, &msg};
  if (!m.marked) abort();
  change_t *changes = batch->changes.ptr;
  size_t kept = 0;
  for (size_t i = 0; i < nchanges; i++) {
    change_t ch = changes[i];
    const plan_t *p = &plans[ch.table];
    if (p->drop) continue;
    if (!mark_change(&m, p, i, &ch)) {
      free(m.marked);
      free_plans(plans, ntables);
      return refuse(batch, err, msg.data);
    }
    changes[kept++] = ch;
  }
  free_plans(plans, ntables);
  // Output spans are u32 offsets from the start of the input's data.
  if ((uint64_t)batch->data.len + m.new_bytes > UINT32_MAX) {
    free(m.marked);
    return refuse(batch, err, "the hashes would take output data past 4 GiB");
  }

  memset(ret, 0, sizeof *ret);
  if (!kept) {
    // Nothing left refers to the tables or values: return empty lists rather than have the
    // host copy them back.
    free(m.marked);
    transform_batch_free(batch);
    return true;
  }

  // Pass 2: hash the marked entries in place, appending their bytes to `output.data`.
  if (m.new_bytes) {
    ret->data.ptr = malloc(m.new_bytes);
    if (!ret->data.ptr) abort();
  }
  uint32_t base = (uint32_t)batch->data.len;
  for (size_t v = 0; v < batch->values.len; v++)
    if (m.marked[v]) hash_value(&batch->values.ptr[v], batch->data.ptr, base, &ret->data);
  free(m.marked);
  // Every hash is made; the input's bytes are not returned (the host keeps its own copy,
  // which the spans we pass through still address), so they are ours to free.
  transform_list_u8_free(&batch->data);

  // The output's tables are the input's: the dropped ones are kept (unused), which the
  // contract allows, so table indexes need no remapping.
  ret->tables = batch->tables;
  ret->values = batch->values;
  // `kept > 0`, so the post-return frees the changes array: its tail beyond `kept` goes with it.
  ret->changes = (zipline_transform_types_list_change_t){changes, kept};
  return true;
}
