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
// Memory: the bindings (gen/transform.c) hand us the batch in memory we own, and free the
// output after the host has copied it (`cabi_post_transform`). So the output reuses the
// batch's arrays in place: kept changes slide down over dropped ones (which we free), and a
// hashed value's old string is freed and replaced by a new allocation.
//
// No <stdio.h>: printf and friends pull in WASI file imports, and a transform must import
// nothing but `host`. Messages are built with the small `buf_*` helpers below.

#include <stdlib.h>
#include <string.h>

#include "gen/transform.h"

typedef zipline_transform_types_value_t value_t;
typedef zipline_transform_types_change_t change_t;
typedef zipline_transform_types_table_t table_t;

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

static bool key_is(const transform_string_t *key, const char *name) { return str_eq(key, name); }

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

static uint64_t fnv1a64(const uint8_t *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Replaces `s` (owned) by the 16 hex digits of its hash.
static void hash_string(transform_string_t *s) {
  static const char digits[] = "0123456789abcdef";
  uint64_t h = fnv1a64(s->ptr, s->len);
  char hex[17];
  for (int i = 0; i < 16; i++) hex[i] = digits[(h >> (60 - 4 * i)) & 0xf];
  hex[16] = '\0';
  transform_string_free(s);
  transform_string_dup(s, hex);
}

static void hash_value(value_t *v) {
  switch (v->tag) {
    case ZIPLINE_TRANSFORM_TYPES_VALUE_TEXT:
      hash_string(&v->val.text);
      break;
    case ZIPLINE_TRANSFORM_TYPES_VALUE_OTHER:
      hash_string(&v->val.other.text);
      break;
    case ZIPLINE_TRANSFORM_TYPES_VALUE_BYTES: {
      uint64_t h = fnv1a64(v->val.bytes.ptr, v->val.bytes.len);
      transform_list_u8_free(&v->val.bytes);
      v->val.bytes.ptr = malloc(8);
      if (!v->val.bytes.ptr) abort();
      for (int i = 0; i < 8; i++) v->val.bytes.ptr[i] = (uint8_t)(h >> (56 - 8 * i));
      v->val.bytes.len = 8;
      break;
    }
    default:
      // NULL, `unchanged`, numbers, temporal values, uuid, numeric, json: kept as they are.
      break;
  }
}

bool exports_transform_init(transform_list_tuple2_string_string_t *config, transform_string_t *err) {
  bool ok = true;
  buf_t msg = {0};
  for (size_t i = 0; i < config->len && ok; i++) {
    const transform_string_t *key = &config->ptr[i].f0;
    const transform_string_t *value = &config->ptr[i].f1;
    name_list_t *list = key_is(key, "drop") ? &DROP : key_is(key, "hash") ? &HASH : NULL;
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

// What to do with one input table's changes: drop them, or hash which columns.
typedef struct {
  bool drop;
  // Per column: hash it? And the column's index among the key columns (or -1).
  bool *hash;
  int32_t *key_index;
  size_t columns;
} plan_t;

static void plan_tables(const zipline_transform_types_list_table_t *tables, plan_t *plans) {
  for (size_t t = 0; t < tables->len; t++) {
    const table_t *table = &tables->ptr[t];
    plan_t *p = &plans[t];
    p->drop = table_listed(&DROP, table);
    p->columns = table->columns.len;
    p->hash = calloc(p->columns ? p->columns : 1, sizeof *p->hash);
    p->key_index = calloc(p->columns ? p->columns : 1, sizeof *p->key_index);
    if (!p->hash || !p->key_index) abort();
    int32_t k = 0;
    for (size_t c = 0; c < p->columns; c++) {
      const zipline_transform_types_column_t *col = &table->columns.ptr[c];
      p->hash[c] = name_listed(&HASH, &col->name);
      p->key_index[c] = col->is_key ? k++ : -1;
    }
  }
}

static void hash_change(const plan_t *p, change_t *ch) {
  for (size_t c = 0; c < p->columns; c++) {
    if (!p->hash[c]) continue;
    if (c < ch->values.len) hash_value(&ch->values.ptr[c]);
    int32_t k = p->key_index[c];
    if (k < 0) continue;
    if ((size_t)k < ch->key.len) hash_value(&ch->key.ptr[k]);
    if (ch->old_key.is_some && (size_t)k < ch->old_key.val.len) hash_value(&ch->old_key.val.ptr[k]);
  }
}

bool exports_transform_transform(transform_batch_t *batch, transform_output_t *ret,
                                 transform_string_t *err) {
  if (!READY) {
    transform_batch_free(batch);
    set_err(err, "transform called before init");
    return false;
  }
  size_t ntables = batch->tables.len;
  // Checked before anything is moved or freed, so an error can free the batch as it came.
  for (size_t i = 0; i < batch->changes.len; i++) {
    uint32_t t = batch->changes.ptr[i].table;
    if (t >= ntables) {
      buf_t msg = {0};
      buf_str(&msg, "change ");
      buf_uint(&msg, i);
      buf_str(&msg, " refers to table #");
      buf_uint(&msg, t);
      buf_str(&msg, " of ");
      buf_uint(&msg, ntables);
      transform_batch_free(batch);
      set_err(err, msg.data);
      return false;
    }
  }
  plan_t *plans = calloc(ntables ? ntables : 1, sizeof *plans);
  if (!plans) abort();
  plan_tables(&batch->tables, plans);

  change_t *changes = batch->changes.ptr;
  size_t kept = 0;
  for (size_t i = 0; i < batch->changes.len; i++) {
    change_t *ch = &changes[i];
    const plan_t *p = &plans[ch->table];
    if (p->drop) {
      zipline_transform_types_change_free(ch);
      continue;
    }
    hash_change(p, ch);
    changes[kept++] = *ch;
  }
  for (size_t t = 0; t < ntables; t++) {
    free(plans[t].hash);
    free(plans[t].key_index);
  }
  free(plans);

  // The output's tables are the input's: the dropped ones are kept (unused), which the
  // contract allows, so indexes need no remapping.
  ret->tables = batch->tables;
  // An empty list's pointer is not an allocation (the bindings free only when len > 0), and
  // the post-return frees only when the output's len > 0: free an emptied array here.
  if (!kept && batch->changes.len) free(changes);
  ret->changes.ptr = kept ? changes : NULL;
  ret->changes.len = kept;
  ret->errors.ptr = NULL;
  ret->errors.len = 0;
  return true;
}
