// Native unit tests of zipline_transform.h: batches laid out as the host lays them (every
// list from malloc, as the bindings hand them over), run with zt_run, the output checked and
// then freed as the bindings' post-return frees it. test.sh builds this with the sanitizers,
// so a leak or a double free fails too.
#define ZIPLINE_TRANSFORM_IMPLEMENTATION
#include "zipline_transform.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond), failures++; \
  } while (0)

// The host's log import, which natively is ours.
static char last_log[256];
void zipline_transform_host_log(zipline_transform_host_level_t level, transform_string_t *m) {
  (void)level;
  snprintf(last_log, sizeof last_log, "%.*s", (int)m->len, (const char *)m->ptr);
}

typedef zipline_transform_types_value_t val_t;
typedef zipline_transform_types_change_t raw_t;
typedef zipline_transform_types_column_t col_t;

static transform_string_t own(const char *s) {
  transform_string_t t = {NULL, strlen(s)};
  if (t.len) t.ptr = malloc(t.len), memcpy(t.ptr, s, t.len);
  return t;
}
static bool str_is(transform_string_t s, const char *c) { return s.len == strlen(c) && !memcmp(s.ptr, c, s.len); }

// A batch under construction: one table `public.users (id int4 key, email text key, n int2,
// note text, ip inet)`, values and data appended by the helpers below.
typedef struct { transform_batch_t b; size_t vcap, ccap, dcap; } builder_t;

static void table(builder_t *t, const char *schema, const char *name) {
  static const struct { const char *n; uint32_t oid; bool key; } cols[] = {
      {"id", 23, true}, {"email", 25, true}, {"n", 21, false}, {"note", 25, false}, {"ip", 869, false}};
  zipline_transform_types_table_t tab = {own(schema), own(name), {malloc(sizeof cols / sizeof *cols * sizeof(col_t)), 5}};
  for (size_t i = 0; i < 5; i++) tab.columns.ptr[i] = (col_t){own(cols[i].n), cols[i].oid, -1, cols[i].key};
  t->b.tables.ptr = realloc(t->b.tables.ptr, (t->b.tables.len + 1) * sizeof tab);
  t->b.tables.ptr[t->b.tables.len++] = tab;
}
static zipline_transform_types_span_t text(builder_t *t, const char *s) {
  size_t n = strlen(s);
  t->b.data.ptr = realloc(t->b.data.ptr, t->b.data.len + n + 1);
  memcpy(t->b.data.ptr + t->b.data.len, s, n);
  t->b.data.len += n;
  return (zipline_transform_types_span_t){(uint32_t)(t->b.data.len - n), (uint32_t)n};
}
static val_t vint4(int32_t n) { return (val_t){.tag = ZT_INT4, .val.int4 = n}; }
static val_t vtext(builder_t *t, const char *s) { return (val_t){.tag = ZT_TEXT, .val.text = text(t, s)}; }
static zipline_transform_types_span_t push(builder_t *t, const val_t *v, size_t n) {
  t->b.values.ptr = realloc(t->b.values.ptr, (t->b.values.len + n + 1) * sizeof *v);
  memcpy(t->b.values.ptr + t->b.values.len, v, n * sizeof *v);
  t->b.values.len += n;
  return (zipline_transform_types_span_t){(uint32_t)(t->b.values.len - n), (uint32_t)n};
}
// Adds a change of table 0; row values id, email, n, note, ip (NULL-free), key (id, email).
static void change(builder_t *t, zt_op op, int32_t id, const char *email, const char *old_email) {
  raw_t c = {.table = 0, .op = (uint8_t)op, .position = {0, 100, (uint32_t)t->b.changes.len + 1}};
  if (op == ZT_INSERT || op == ZT_UPDATE) {
    val_t row[5] = {vint4(id), vtext(t, email), {.tag = ZT_INT2, .val.int2 = 7}, vtext(t, "hello"),
                    {.tag = ZT_OTHER, .val.other = {869, text(t, "10.0.0.1")}}};
    c.values = push(t, row, 5);
  }
  if (op != ZT_TRUNCATE) {
    val_t key[2] = {vint4(id), vtext(t, email)};
    c.key = push(t, key, 2);
  }
  if (old_email) {
    val_t old[2] = {vint4(id), vtext(t, old_email)};
    c.old_key = (zipline_transform_types_option_span_t){true, push(t, old, 2)};
  }
  t->b.changes.ptr = realloc(t->b.changes.ptr, (t->b.changes.len + 1) * sizeof c);
  t->b.changes.ptr[t->b.changes.len++] = c;
}

// What the bindings' post-return does with an output.
static void post_return(transform_output_t *o) {
  for (size_t i = 0; i < o->tables.len; i++) {
    zipline_transform_types_table_t *t = &o->tables.ptr[i];
    if (t->schema.len) free(t->schema.ptr);
    if (t->name.len) free(t->name.ptr);
    for (size_t j = 0; j < t->columns.len; j++)
      if (t->columns.ptr[j].name.len) free(t->columns.ptr[j].name.ptr);
    if (t->columns.len) free(t->columns.ptr);
  }
  if (o->tables.len) free(o->tables.ptr);
  if (o->data.len) free(o->data.ptr);
  if (o->values.len) free(o->values.ptr);
  if (o->changes.len) free(o->changes.ptr);
  for (size_t i = 0; i < o->errors.len; i++)
    if (o->errors.ptr[i].message.len) free(o->errors.ptr[i].message.ptr);
  if (o->errors.len) free(o->errors.ptr);
}

// The text behind an output value's span (input data, then output data).
static const uint8_t *input_data;
static size_t input_len;
static bool out_text(const transform_output_t *o, zipline_transform_types_span_t s, const char *want) {
  const uint8_t *p = s.start >= input_len ? o->data.ptr + (s.start - input_len) : input_data + s.start;
  return s.len == strlen(want) && !memcmp(p, want, s.len);
}

// Runs f over b; input_data keeps a copy of the input's bytes (the host's, which spans into
// the input address and which zt_run frees in the guest).
static bool run(zt_change_fn f, builder_t *t, transform_output_t *out, transform_string_t *err) {
  static uint8_t copy[4096];
  memcpy(copy, t->b.data.ptr ? t->b.data.ptr : copy, t->b.data.len);
  input_data = copy, input_len = t->b.data.len;
  return zt_run(f, &t->b, out, err);
}

static bool setup_none(zt_config *cfg) { return zt_config_allow_only(cfg, NULL); }
static void init_with(zt_setup_fn setup, const char **pairs, size_t n, const char *want_err) {
  transform_list_tuple2_string_string_t cfg = {n ? malloc(n * sizeof *cfg.ptr) : (void *)8, n};
  for (size_t i = 0; i < n; i++) cfg.ptr[i] = (transform_tuple2_string_string_t){own(pairs[2 * i]), own(pairs[2 * i + 1])};
  transform_string_t err = {0};
  bool ok = zt_run_init(setup, &cfg, &err);
  CHECK(ok == !want_err);
  if (!ok) {
    CHECK(want_err && str_is(err, want_err));
    free(err.ptr);
  }
}

static bool touch_nothing(zt_change *c) { (void)c; return true; }

static void test_pass_through(void) {
  builder_t t = {0};
  table(&t, "public", "users");
  change(&t, ZT_INSERT, 1, "a@x", NULL);
  change(&t, ZT_DELETE, 1, "a@x", NULL);
  val_t *values = t.b.values.ptr;
  size_t nvalues = t.b.values.len;
  transform_output_t o;
  transform_string_t err;
  CHECK(run(touch_nothing, &t, &o, &err));
  CHECK(o.values.ptr == values && o.values.len == nvalues);  // handed over, not copied
  CHECK(o.tables.len == 1 && o.data.len == 0 && o.changes.len == 2 && o.errors.len == 0);
  CHECK(o.changes.ptr[1].op == ZT_DELETE && o.changes.ptr[1].position.ordinal == 2);
  post_return(&o);
}

static bool reads(zt_change *c) {
  zt_str s;
  int64_t n;
  double f;
  bool b;
  CHECK(zt_is_table(c, "public.users") && zt_is_table(c, "users") && !zt_is_table(c, "x.users"));
  CHECK(zt_str_eq(zt_schema(c), "public") && zt_ncolumns(c) == 5 && zt_str_eq(zt_column_name(c, 4), "ip"));
  CHECK(zt_get_int(c, "id", &n) && n == 1 && zt_get_float(c, 0, &f) && f == 1.0);
  CHECK(zt_get_str(c, "email", &s) && zt_str_eq(s, "a@x"));
  CHECK(!zt_get_bool(c, "id", &b) && !zt_get_str(c, "nope", &s) && !zt_has_column(c, 9) && zt_has_column(c, "ip"));
  CHECK(zt_kind_of(c, "nope") == -1 && !zt_is_null(c, "id"));
  if (zt_op_of(c) == ZT_INSERT) {
    zt_value v;
    CHECK(zt_get(c, "ip", &v) && v.kind == ZT_OTHER && v.oid == 869 && zt_str_eq(v.s, "10.0.0.1"));
    CHECK(zt_get_int(c, "n", &n) && n == 7 && zt_kind_of(c, 2) == ZT_INT2);
  } else {  // a delete holds its key columns only
    CHECK(zt_kind_of(c, "n") == -1 && !zt_get_str(c, "note", &s));
  }
  return true;
}

static void test_reads(void) {
  builder_t t = {0};
  table(&t, "public", "users");
  change(&t, ZT_INSERT, 1, "a@x", NULL);
  change(&t, ZT_DELETE, 1, "a@x", NULL);
  transform_output_t o;
  transform_string_t err;
  CHECK(run(reads, &t, &o, &err));
  post_return(&o);
}

static zt_str upper(zt_str s, zt_kind kind, void *ctx) {
  static char buf[64];
  (void)ctx, (void)kind;
  for (size_t i = 0; i < s.len; i++) buf[i] = s.ptr[i] >= 'a' && s.ptr[i] <= 'z' ? s.ptr[i] - 32 : s.ptr[i];
  return (zt_str){buf, s.len};
}

static bool writes(zt_change *c) {
  int32_t ordinal = (int32_t)zt_position(c).ordinal;
  if (ordinal == 1) return zt_map_str(c, "email", upper, NULL) && zt_set_null(c, "note");
  if (ordinal == 2) return zt_set_int(c, "n", 70000);  // does not fit int2: refused
  if (ordinal == 3) return zt_set_str(c, "email", "new@x") && zt_set_int(c, "id", 9);
  if (ordinal == 4) return zt_refuse(c, "no %s %d", "thanks", -4);
  return zt_set(c, "nope", zt_int(1));
}

static void test_writes(void) {
  builder_t t = {0};
  table(&t, "public", "users");
  change(&t, ZT_UPDATE, 1, "a@x", "old@x");
  change(&t, ZT_INSERT, 2, "b@x", NULL);
  change(&t, ZT_INSERT, 3, "c@x", NULL);
  change(&t, ZT_INSERT, 4, "d@x", NULL);
  change(&t, ZT_INSERT, 5, "e@x", NULL);
  transform_output_t o;
  transform_string_t err;
  CHECK(run(writes, &t, &o, &err));
  CHECK(o.changes.len == 2 && o.errors.len == 3);
  const val_t *v = o.values.ptr;
  const raw_t *u = &o.changes.ptr[0], *i = &o.changes.ptr[1];
  CHECK(out_text(&o, v[u->values.start + 1].val.text, "A@X") && out_text(&o, v[u->key.start + 1].val.text, "A@X"));
  CHECK(out_text(&o, v[u->old_key.val.start + 1].val.text, "OLD@X") && v[u->values.start + 3].tag == ZT_NULL);
  CHECK(v[u->values.start + 1].val.text.start >= input_len);  // new bytes count on from the input's
  CHECK(out_text(&o, v[i->values.start + 1].val.text, "new@x") && out_text(&o, v[i->key.start + 1].val.text, "new@x"));
  CHECK(v[i->key.start].tag == ZT_INT4 && v[i->key.start].val.int4 == 9 && v[i->values.start].val.int4 == 9);
  CHECK(o.errors.ptr[0].index == 1 && str_is(o.errors.ptr[0].message, "70000 does not fit column n"));
  CHECK(o.errors.ptr[1].index == 3 && str_is(o.errors.ptr[1].message, "no thanks -4"));
  CHECK(str_is(o.errors.ptr[2].message, "public.users has no column \"nope\""));
  post_return(&o);
}

static bool not_test(zt_change *row, void *ctx) {
  zt_str s;
  (void)ctx;
  return !(zt_get_str(row, "note", &s) && zt_str_eq(s, "test"));
}
static bool filters(zt_change *c) {
  if (zt_position(c).ordinal <= 2) zt_set_str(c, "note", "test");
  zt_filter(c, not_test, NULL);
  return true;
}

static void test_filter(void) {
  builder_t t = {0};
  table(&t, "public", "users");
  change(&t, ZT_INSERT, 1, "a@x", NULL);           // fails: dropped
  change(&t, ZT_UPDATE, 2, "b@x", "was@x");        // fails: delete of the old key
  change(&t, ZT_UPDATE, 3, "c@x", NULL);           // passes: an update
  change(&t, ZT_DELETE, 4, "d@x", NULL);           // passes
  transform_output_t o;
  transform_string_t err;
  CHECK(run(filters, &t, &o, &err));
  CHECK(o.changes.len == 3);
  const raw_t *d = &o.changes.ptr[0];
  CHECK(d->op == ZT_DELETE && !d->old_key.is_some && d->values.len == 0);
  CHECK(out_text(&o, o.values.ptr[d->key.start + 1].val.text, "was@x"));
  CHECK(o.changes.ptr[1].op == ZT_UPDATE && o.changes.ptr[2].op == ZT_DELETE);
  post_return(&o);
}

static bool reshapes(zt_change *c) {
  static const zt_column cols[] = {{"who", 25, -1, true}, {"what", 25, -1, false}};
  static const zt_table audit = {"public", "audit", cols, 2};
  zt_str email;
  zt_get_str(c, "email", &email);
  zt_rename_table(c, "archive", "users");
  if (!zt_rename_column(c, "note", "remark") || !zt_drop_column(c, "ip")) return false;
  if (!zt_emit(c, ZT_INSERT, &audit, (zt_value[]){zt_text_n(email.ptr, email.len), zt_text("seen")})) return false;
  zt_emit_copy(c, "copy", "users");
  if (zt_drop_column(c, "id")) return zt_refuse(c, "dropped a key column");
  return zt_position(c).ordinal == 2 ? zt_refuse(c, "second") : true;  // takes its emits along
}

static void test_reshape(void) {
  builder_t t = {0};
  table(&t, "public", "users");
  change(&t, ZT_INSERT, 1, "a@x", NULL);
  change(&t, ZT_INSERT, 2, "b@x", NULL);
  change(&t, ZT_INSERT, 3, "c@x", NULL);
  transform_output_t o;
  transform_string_t err;
  CHECK(run(reshapes, &t, &o, &err));
  CHECK(o.changes.len == 6 && o.errors.len == 1 && o.errors.ptr[0].index == 1);
  // input; archive.users after each edit (renamed, remark, no ip); public.audit; copy.users:
  // each once, for three changes
  CHECK(o.tables.len == 6);
  const zipline_transform_types_table_t *a = &o.tables.ptr[o.changes.ptr[0].table];
  CHECK(str_is(a->schema, "archive") && a->columns.len == 4 && str_is(a->columns.ptr[3].name, "remark"));
  CHECK(o.changes.ptr[0].values.len == 4 && o.changes.ptr[3].table == o.changes.ptr[0].table);
  const raw_t *e = &o.changes.ptr[1];
  CHECK(str_is(o.tables.ptr[e->table].name, "audit") && e->key.len == 1 && e->position.ordinal == 1);
  CHECK(out_text(&o, o.values.ptr[e->key.start].val.text, "a@x") && e->values.len == 2);
  CHECK(e->values.start != 0 && o.values.ptr[e->values.start].val.text.start < input_len);  // span kept
  CHECK(str_is(o.tables.ptr[o.changes.ptr[2].table].schema, "copy"));
  post_return(&o);
}

static bool drop_all(zt_change *c) { return zt_drop(c), true; }
static bool bad(zt_change *c) { return zt_fail_batch(c, "broken %zu", (size_t)42); }

static void test_batch_outcomes(void) {
  builder_t t = {0};
  table(&t, "public", "users");
  change(&t, ZT_INSERT, 1, "a@x", NULL);
  transform_output_t o;
  transform_string_t err;
  CHECK(run(drop_all, &t, &o, &err));  // nothing left: empty lists, the batch freed
  CHECK(o.changes.len == 0 && o.values.len == 0 && o.tables.len == 0 && o.data.len == 0);
  post_return(&o);

  builder_t u = {0};
  table(&u, "public", "users");
  change(&u, ZT_INSERT, 1, "a@x", NULL);
  CHECK(!run(bad, &u, &o, &err) && str_is(err, "broken 42"));
  free(err.ptr);

  builder_t w = {0};
  table(&w, "public", "users");
  change(&w, ZT_INSERT, 1, "a@x", NULL);
  w.b.changes.ptr[0].key.len = 99;
  CHECK(!run(touch_nothing, &w, &o, &err) && str_is(err, "change 0: key span 5+99 is out of range"));
  free(err.ptr);
}

static zt_list items;
static int64_t limit;
static bool setup_full(zt_config *cfg) {
  bool b;
  if (!zt_config_allow_only(cfg, "list", "limit", "flag", NULL)) return false;
  items = zt_config_list(cfg, "list");
  if (!zt_config_int(cfg, "limit", 10, &limit) || !zt_config_bool(cfg, "flag", false, &b)) return false;
  zt_log(ZT_INFO, "%zu items, limit %lld, %s", items.len, (long long)limit, zt_config_get(cfg, "x", "none").ptr);
  return true;
}

static void test_config(void) {
  init_with(setup_full, (const char *[]){"list", " a, ,b ,", "limit", "-3"}, 2, NULL);
  CHECK(items.len == 2 && !strcmp(items.items[0], "a") && !strcmp(items.items[1], "b") && limit == -3);
  CHECK(!strcmp(last_log, "2 items, limit -3, none"));
  init_with(setup_full, (const char *[]){"limit", "12x"}, 1, "config key `limit`: `12x` is not an integer");
  init_with(setup_full, (const char *[]){"flag", "yes"}, 1, "config key `flag`: `yes` is not true or false");
  init_with(setup_full, (const char *[]){"list", "a", "lst", "b"}, 2, "unknown config key `lst`; expected list, limit, flag");
  init_with(setup_none, (const char *[]){"x", "1"}, 1, "unknown config key `x`; expected none");
  init_with(setup_none, NULL, 0, NULL);
}

static void test_format(void) {
  char buf[16];
  CHECK(zt__sprint(buf, sizeof buf, "%d|%u|%lld|%.*s|%c%%", -12, 7u, (long long)INT64_MIN, 2, "abc", 'z') == 15);
  CHECK(!strcmp(buf, "-12|7|-92233720"));  // cut to fit, NUL-terminated
  CHECK(zt__sprint(buf, sizeof buf, "%llu %zu", 18446744073709551615ULL, (size_t)0) == 15 && !strcmp(buf, "184467440737095"));
}

int main(void) {
  init_with(setup_none, NULL, 0, NULL);
  test_pass_through();
  test_reads();
  test_writes();
  test_filter();
  test_reshape();
  test_batch_outcomes();
  test_format();
  test_config();
  if (failures) return fprintf(stderr, "%d check(s) failed\n", failures), 1;
  printf("sdk/c: all tests passed\n");
  return 0;
}
