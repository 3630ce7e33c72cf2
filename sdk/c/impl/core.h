// Part of zipline_transform.h's implementation (included there, with
// ZIPLINE_TRANSFORM_IMPLEMENTATION, after the API): the output's types, allocation, text
// formatting, config and init.
// No <stdio.h>: printf and friends pull in WASI imports, which a transform does not get.
#include <stdlib.h>
#include <string.h>

typedef zipline_transform_types_value_t zt__val;
typedef zipline_transform_types_span_t zt__span;
typedef zipline_transform_types_change_t zt__raw;
typedef zipline_transform_types_table_t zt__table;
typedef zipline_transform_types_column_t zt__column;
typedef zipline_transform_types_change_error_t zt__error;

// One batch's output, built from the input: its tables and values lists are handed over
// (grown when needed), `data` holds the new bytes only.
typedef struct {
  transform_batch_t *in;
  uint32_t base;  // the input data's length: output spans count on from it
  uint8_t *data; size_t dlen, dcap;
  void **retired; size_t nretired, cretired;  // outgrown data buffers: strings read stay valid
  zt__val *values; size_t vlen, vcap;         // cap 0: the input's pointer may be a dummy
  zt__table *tables; size_t tlen, tcap;
  zt__raw *changes; size_t clen, ccap;
  zt__error *errors; size_t elen, ecap;
  struct { uint32_t from, to; char edit; size_t col; } *reshaped; size_t rlen, rcap;
  bool failed; char fail[256];
} zt__out;

struct zt_change { zt__out *o; zt__raw raw; uint32_t index; bool dropped, has_msg; char msg[256]; };
struct zt_config { transform_list_tuple2_string_string_t pairs; bool has_msg; char msg[256]; };

static zt_config zt__cfg;
static bool zt__ready;
static void **zt__kept; static size_t zt__nkept, zt__ckept;  // config lists, freed at next init

static void *zt__alloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) abort();
  return p;
}
// Makes room for `more` items; a list whose cap is 0 is not ours (or a dummy) and is copied.
static void zt__grow(void **ptr, size_t *cap, size_t len, size_t more, size_t size) {
  if (len + more <= *cap) return;
  size_t n = len + more > *cap * 2 ? len + more + 8 : *cap * 2;
  void *p = zt__alloc(n * size);
  if (len) memcpy(p, *ptr, len * size);
  if (*cap) free(*ptr);
  *ptr = p, *cap = n;
}
#define ZT__PUSH(o, list, len, cap, item) \
  (zt__grow((void **)&(o)->list, &(o)->cap, (o)->len, 1, sizeof *(o)->list), (o)->list[(o)->len++] = (item))

static transform_string_t zt__dup(const void *p, size_t n) {
  transform_string_t s = {NULL, 0};  // empty: no allocation (lists of len 0 are never freed)
  if (n) s.ptr = zt__alloc(n), s.len = n, memcpy(s.ptr, p, n);
  return s;
}
static zt_str zt__s(transform_string_t s) { return (zt_str){(const char *)s.ptr, s.len}; }
static bool zt__eq(transform_string_t a, transform_string_t b) {
  return a.len == b.len && (!a.len || memcmp(a.ptr, b.ptr, a.len) == 0);
}
bool zt_str_eq(zt_str a, const char *b) {
  return a.len == strlen(b) && (!a.len || memcmp(a.ptr, b, a.len) == 0);
}
zt_value zt_text(const char *s) { return zt_text_n(s, strlen(s)); }

size_t zt_format(char *buf, size_t size, const char *fmt, va_list ap) {
  size_t n = 0;
#define ZT__PUT(ch) do { if (n + 1 < size) buf[n++] = (ch); } while (0)
  for (; *fmt; fmt++) {
    if (*fmt != '%') { ZT__PUT(*fmt); continue; }
    const char *s = NULL;
    size_t slen = 0;
    long long v = 0;
    unsigned long long u = 0;
    bool is_signed = false;
    fmt++;
    if (!strncmp(fmt, ".*s", 3)) slen = (size_t)va_arg(ap, int), s = va_arg(ap, const char *), fmt += 2;
    else if (*fmt == 's') s = va_arg(ap, const char *), s = s ? s : "(null)", slen = strlen(s);
    else if (*fmt == 'c') { ZT__PUT((char)va_arg(ap, int)); continue; }
    else if (*fmt == 'd') v = va_arg(ap, int), is_signed = true;
    else if (*fmt == 'u') u = va_arg(ap, unsigned);
    else if (!strncmp(fmt, "lld", 3)) v = va_arg(ap, long long), is_signed = true, fmt += 2;
    else if (!strncmp(fmt, "llu", 3)) u = va_arg(ap, unsigned long long), fmt += 2;
    else if (!strncmp(fmt, "zu", 2)) u = va_arg(ap, size_t), fmt += 1;
    else if (*fmt == '%') { ZT__PUT('%'); continue; }
    else break;  // not in the subset: stop rather than misread the arguments
    if (s) { for (size_t i = 0; i < slen; i++) ZT__PUT(s[i]); continue; }
    if (is_signed && v < 0) ZT__PUT('-');
    if (is_signed) u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    char digits[20];
    size_t d = 0;
    do digits[d++] = (char)('0' + u % 10), u /= 10; while (u);
    while (d--) ZT__PUT(digits[d]);  // d-- outside the macro: it may skip its argument
  }
#undef ZT__PUT
  if (size) buf[n] = '\0';
  return n;
}

static size_t zt__sprint(char *buf, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  size_t n = zt_format(buf, size, fmt, ap);
  va_end(ap);
  return n;
}
void zt_log(zt_level level, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  transform_string_t s = {(uint8_t *)buf, zt_format(buf, sizeof buf, fmt, ap)};
  va_end(ap);
  zipline_transform_host_log((zipline_transform_host_level_t)level, &s);
}
bool zt_refuse(zt_change *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  zt_format(c->msg, sizeof c->msg, fmt, ap);
  va_end(ap);
  return c->has_msg = true, false;
}
bool zt_fail_batch(zt_change *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (!c->o->failed) zt_format(c->o->fail, sizeof c->o->fail, fmt, ap);
  va_end(ap);
  return c->o->failed = true, false;
}
bool zt_fail(zt_config *cfg, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  zt_format(cfg->msg, sizeof cfg->msg, fmt, ap);
  va_end(ap);
  return cfg->has_msg = true, false;
}

// ---- config ----

static void zt__keep(void *p) {
  zt__grow((void **)&zt__kept, &zt__ckept, zt__nkept, 1, sizeof *zt__kept);
  zt__kept[zt__nkept++] = p;
}
static const transform_string_t *zt__lookup(const zt_config *cfg, const char *key) {
  const transform_string_t *found = NULL;  // the last wins, as a map would have it
  for (size_t i = 0; i < cfg->pairs.len; i++)
    if (zt_str_eq(zt__s(cfg->pairs.ptr[i].f0), key)) found = &cfg->pairs.ptr[i].f1;
  return found;
}
size_t zt_config_len(const zt_config *cfg) { return cfg->pairs.len; }
zt_str zt_config_key(const zt_config *cfg, size_t i) { return zt__s(cfg->pairs.ptr[i].f0); }
zt_str zt_config_value(const zt_config *cfg, size_t i) { return zt__s(cfg->pairs.ptr[i].f1); }
bool zt_config_has(const zt_config *cfg, const char *key) { return zt__lookup(cfg, key) != NULL; }
zt_str zt_config_get(const zt_config *cfg, const char *key, const char *fallback) {
  const transform_string_t *v = zt__lookup(cfg, key);
  return v ? zt__s(*v) : (zt_str){fallback, fallback ? strlen(fallback) : 0};
}
static bool zt__space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }
zt_list zt_split(zt_str s) {
  // One copy of s with its items' ends turned into NULs, and pointers to the items.
  char *buf = zt__alloc(s.len + 1);
  const char **items = zt__alloc((s.len / 2 + 1) * sizeof *items);
  size_t n = 0;
  zt__keep(buf), zt__keep(items);
  if (s.len) memcpy(buf, s.ptr, s.len);
  for (size_t at = 0; at <= s.len;) {
    size_t end = at;
    while (end < s.len && buf[end] != ',') end++;
    size_t a = at, b = end;
    while (a < b && zt__space(buf[a])) a++;
    while (b > a && zt__space(buf[b - 1])) b--;
    buf[b] = '\0';
    if (a < b) items[n++] = buf + a;
    at = end + 1;
  }
  return (zt_list){items, n};
}
zt_list zt_config_list(zt_config *cfg, const char *key) { return zt_split(zt_config_get(cfg, key, "")); }
bool zt_config_int(zt_config *cfg, const char *key, int64_t fallback, int64_t *out) {
  zt_str s = zt_config_get(cfg, key, NULL);
  *out = fallback;
  if (!s.ptr) return true;
  size_t i = s.len && (s.ptr[0] == '-' || s.ptr[0] == '+');
  uint64_t u = 0, limit = s.len && s.ptr[0] == '-' ? (uint64_t)INT64_MAX + 1 : INT64_MAX;
  bool ok = i < s.len;
  for (; ok && i < s.len; i++)
    ok = s.ptr[i] >= '0' && s.ptr[i] <= '9' && u <= (limit - (uint64_t)(s.ptr[i] - '0')) / 10,
    u = u * 10 + (uint64_t)(s.ptr[i] - '0');
  if (!ok) return zt_fail(cfg, "config key `%s`: `%.*s` is not an integer", key, (int)s.len, s.ptr);
  *out = s.ptr[0] == '-' ? (int64_t)(0 - u) : (int64_t)u;
  return true;
}
bool zt_config_bool(zt_config *cfg, const char *key, bool fallback, bool *out) {
  zt_str s = zt_config_get(cfg, key, NULL);
  *out = s.ptr ? zt_str_eq(s, "true") || zt_str_eq(s, "1") : fallback;
  if (!s.ptr || *out || zt_str_eq(s, "false") || zt_str_eq(s, "0")) return true;
  return zt_fail(cfg, "config key `%s`: `%.*s` is not true or false", key, (int)s.len, s.ptr);
}
bool zt_config_allow_only(zt_config *cfg, ...) {
  for (size_t i = 0; i < cfg->pairs.len; i++) {
    zt_str key = zt__s(cfg->pairs.ptr[i].f0);
    bool known = false;
    va_list ap;
    va_start(ap, cfg);
    for (const char *k; !known && (k = va_arg(ap, const char *));) known = zt_str_eq(key, k);
    va_end(ap);
    if (known) continue;
    char expected[200] = "";
    size_t n = 0;
    va_start(ap, cfg);
    for (const char *k; (k = va_arg(ap, const char *)) && n + strlen(k) + 3 < sizeof expected; n += strlen(k))
      n += n ? (strcpy(expected + n, ", "), 2) : 0, strcpy(expected + n, k);
    va_end(ap);
    return zt_fail(cfg, "unknown config key `%.*s`; expected %s", (int)key.len, key.ptr, n ? expected : "none");
  }
  return true;
}

static void zt__free_pairs(transform_list_tuple2_string_string_t *l) {
  for (size_t i = 0; i < l->len; i++) {
    if (l->ptr[i].f0.len) free(l->ptr[i].f0.ptr);
    if (l->ptr[i].f1.len) free(l->ptr[i].f1.ptr);
  }
  if (l->len) free(l->ptr);
  l->len = 0;
}

bool zt_run_init(zt_setup_fn setup, transform_list_tuple2_string_string_t *config, transform_string_t *err) {
  zt__ready = false;
  // The config is kept (its strings are the transform's) until the next init.
  zt__free_pairs(&zt__cfg.pairs);
  while (zt__nkept) free(zt__kept[--zt__nkept]);
  zt__cfg = (zt_config){.pairs = *config};
  if (!setup(&zt__cfg)) {
    const char *msg = zt__cfg.has_msg ? zt__cfg.msg : "init failed";
    *err = zt__dup(msg, strlen(msg));
    return false;
  }
  return zt__ready = true;
}
