// zipline_transform.h: Zipline transforms in C without touching the batch layout.
//
// One header, stb-style: include it anywhere; in exactly one .c file, define
// ZIPLINE_TRANSFORM_IMPLEMENTATION before including it and call ZT_EXPORT(setup, change).
// It needs the contract's C bindings (`wit-bindgen c`, sdk/c/gen/) on the include path.
//
// `setup(cfg)` runs once per instance with the route's config; `change(c)` runs on every
// change of every batch, in commit order, and returns false to refuse that change. A change
// nobody touched goes out as it came: the output's values list is the input's, nothing is
// decoded or copied; new texts are appended once to the output's data. See README.md.
#ifndef ZIPLINE_TRANSFORM_H
#define ZIPLINE_TRANSFORM_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transform.h"

// A string or byte run, not NUL-terminated. Strings read from a batch stay valid until the
// batch ends; config strings until the next init.
typedef struct { const char *ptr; size_t len; } zt_str;

typedef enum { ZT_INSERT, ZT_UPDATE, ZT_DELETE, ZT_TRUNCATE } zt_op;
// A value's variant, numbered as the contract's `value`.
typedef enum {
  ZT_NULL, ZT_BOOL, ZT_INT2, ZT_INT4, ZT_INT8, ZT_FLOAT4, ZT_FLOAT8, ZT_NUMERIC, ZT_TEXT,
  ZT_BYTES, ZT_DATE, ZT_TIME, ZT_TIMESTAMP, ZT_TIMESTAMPTZ, ZT_UUID, ZT_JSON, ZT_OTHER,
  ZT_UNCHANGED
} zt_kind;
typedef enum { ZT_TRACE, ZT_DEBUG, ZT_INFO, ZT_WARN, ZT_ERROR } zt_level;

// A decoded value. Integers of every width (and dates, times, timestamps) are in `i`; the
// span-valued kinds (numeric, text, bytes, json, other) in `s`; `oid` is an `other`'s type.
typedef struct {
  zt_kind kind;
  uint32_t oid;
  union { bool b; int64_t i; double f; zt_str s; uint64_t uuid[2]; };
} zt_value;

static inline zt_value zt_null(void) { return (zt_value){.kind = ZT_NULL}; }
static inline zt_value zt_bool(bool b) { return (zt_value){.kind = ZT_BOOL, .b = b}; }
static inline zt_value zt_int(int64_t i) { return (zt_value){.kind = ZT_INT8, .i = i}; }
static inline zt_value zt_float(double f) { return (zt_value){.kind = ZT_FLOAT8, .f = f}; }
static inline zt_value zt_text_n(const char *p, size_t n) {
  return (zt_value){.kind = ZT_TEXT, .s = {p, n}};
}
zt_value zt_text(const char *s);  // NUL-terminated
static inline zt_value zt_bytes(const void *p, size_t n) {
  return (zt_value){.kind = ZT_BYTES, .s = {(const char *)p, n}};
}

// A table shape for zt_emit.
typedef struct { const char *name; uint32_t type_oid; int32_t type_modifier; bool is_key; } zt_column;
typedef struct { const char *schema, *name; const zt_column *columns; size_t ncolumns; } zt_table;

typedef struct zt_change zt_change;
typedef struct zt_config zt_config;
typedef struct { const char **items; size_t len; } zt_list;  // NUL-terminated items

// A column: a name or an index. The macros below take either (`"email"` or `1`).
typedef struct { const char *name; int64_t index; } zt_col;
static inline zt_col zt__by_name(const char *n) { return (zt_col){n, -1}; }
static inline zt_col zt__by_index(int64_t i) { return (zt_col){NULL, i}; }
#define ZT_COL(x) _Generic((x), char *: zt__by_name, const char *: zt__by_name, default: zt__by_index)(x)

// Reading a change. Getters read the new row (for a delete: its key columns) and return
// false when there is no such column, no value for it, or a value of another kind.
zt_op zt_op_of(const zt_change *c);
zt_str zt_schema(const zt_change *c);
zt_str zt_table_name(const zt_change *c);
bool zt_is_table(const zt_change *c, const char *name);  // `schema.table`, or a bare `table`
size_t zt_ncolumns(const zt_change *c);
zt_str zt_column_name(const zt_change *c, size_t i);
zipline_transform_types_position_t zt_position(const zt_change *c);
bool zt_get_(zt_change *c, zt_col col, zt_value *out);
bool zt_get_str_(zt_change *c, zt_col col, zt_str *out);  // text, numeric, json, other
bool zt_get_int_(zt_change *c, zt_col col, int64_t *out);  // any integer width
bool zt_get_float_(zt_change *c, zt_col col, double *out); // integers converted
bool zt_get_bool_(zt_change *c, zt_col col, bool *out);
bool zt_is_null_(zt_change *c, zt_col col);
int zt_kind_of_(zt_change *c, zt_col col);  // a zt_kind, or -1
bool zt_has_column_(zt_change *c, zt_col col);
#define zt_get(c, col, out) zt_get_((c), ZT_COL(col), (out))
#define zt_get_str(c, col, out) zt_get_str_((c), ZT_COL(col), (out))
#define zt_get_int(c, col, out) zt_get_int_((c), ZT_COL(col), (out))
#define zt_get_float(c, col, out) zt_get_float_((c), ZT_COL(col), (out))
#define zt_get_bool(c, col, out) zt_get_bool_((c), ZT_COL(col), (out))
#define zt_is_null(c, col) zt_is_null_((c), ZT_COL(col))
#define zt_kind_of(c, col) zt_kind_of_((c), ZT_COL(col))
#define zt_has_column(c, col) zt_has_column_((c), ZT_COL(col))

// Writing a change. Each returns false, with the change's refusal message set, for a column
// the table lacks or a value that does not fit: `return false` from `change` then refuses
// it. Integers are written at the column's width; a string keeps the kind of the value it
// replaces, else takes the column type's. Setting a key column sets the change's key too.
bool zt_set_(zt_change *c, zt_col col, zt_value v);
#define zt_set(c, col, v) zt_set_((c), ZT_COL(col), (v))
#define zt_set_str(c, col, s) zt_set_((c), ZT_COL(col), zt_text(s))
#define zt_set_int(c, col, n) zt_set_((c), ZT_COL(col), zt_int(n))
#define zt_set_float(c, col, f) zt_set_((c), ZT_COL(col), zt_float(f))
#define zt_set_bool(c, col, b) zt_set_((c), ZT_COL(col), zt_bool(b))
#define zt_set_null(c, col) zt_set_((c), ZT_COL(col), zt_null())

// Rewrites col's value by f everywhere the change holds it: row, key and an update's old
// key (each value once). zt_map_str takes text, numeric, json and other values,
// zt_map_bytes bytea, zt_map all five (f gets the kind). NULL, unchanged and other kinds are
// left alone, and so is a value f returns as it was (same pointer and length). f's result
// is copied at once: a static buffer will do.
typedef zt_str (*zt_map_fn)(zt_str s, zt_kind kind, void *ctx);
bool zt_map_(zt_change *c, zt_col col, unsigned kinds, zt_map_fn f, void *ctx);
#define ZT__SPAN_KINDS (1u << ZT_NUMERIC | 1u << ZT_TEXT | 1u << ZT_BYTES | 1u << ZT_JSON | 1u << ZT_OTHER)
#define zt_map(c, col, f, ctx) zt_map_((c), ZT_COL(col), ZT__SPAN_KINDS, (f), (ctx))
#define zt_map_str(c, col, f, ctx) zt_map_((c), ZT_COL(col), ZT__SPAN_KINDS & ~(1u << ZT_BYTES), (f), (ctx))
#define zt_map_bytes(c, col, f, ctx) zt_map_((c), ZT_COL(col), 1u << ZT_BYTES, (f), (ctx))

void zt_drop(zt_change *c);
void zt_keep(zt_change *c);
bool zt_dropped(const zt_change *c);
// New table shapes are built once per batch.
void zt_rename_table(zt_change *c, const char *schema, const char *name);
bool zt_rename_column_(zt_change *c, zt_col col, const char *name);
bool zt_drop_column_(zt_change *c, zt_col col);  // not a key column
#define zt_rename_column(c, col, name) zt_rename_column_((c), ZT_COL(col), (name))
#define zt_drop_column(c, col) zt_drop_column_((c), ZT_COL(col))
// Emitted changes follow the change, with its position; a refused change takes them along.
void zt_emit_copy(zt_change *c, const char *schema, const char *name);
bool zt_emit(zt_change *c, zt_op op, const zt_table *t, const zt_value *values);  // one per column
// Inserts failing keep are dropped, updates failing it become deletes of their old key;
// deletes and truncates pass. Needs whole rows (REPLICA IDENTITY FULL, `row_filter: true`).
void zt_filter(zt_change *c, bool (*keep)(zt_change *row, void *ctx), void *ctx);

// Refuses the change with a message (a printf subset: %s %.*s %c %d %u %lld %llu %zu %%);
// returns false, for `return zt_refuse(c, ...)`. zt_fail_batch fails the whole batch.
bool zt_refuse(zt_change *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool zt_fail_batch(zt_change *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Config (values valid until the next init).
bool zt_config_has(const zt_config *cfg, const char *key);
zt_str zt_config_get(const zt_config *cfg, const char *key, const char *fallback);
zt_list zt_config_list(zt_config *cfg, const char *key);  // comma-separated, trimmed, no empties
bool zt_config_int(zt_config *cfg, const char *key, int64_t fallback, int64_t *out);
bool zt_config_bool(zt_config *cfg, const char *key, bool fallback, bool *out);
bool zt_config_allow_only(zt_config *cfg, ...);  // known keys, then NULL
size_t zt_config_len(const zt_config *cfg);
zt_str zt_config_key(const zt_config *cfg, size_t i);
zt_str zt_config_value(const zt_config *cfg, size_t i);
// Stops init with a message; returns false, for `return zt_fail(cfg, ...)`.
bool zt_fail(zt_config *cfg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void zt_log(zt_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
size_t zt_format(char *buf, size_t size, const char *fmt, va_list ap);  // NUL-terminated, cut to fit
bool zt_str_eq(zt_str a, const char *b);
zt_list zt_split(zt_str s);  // what zt_config_list does, on any string (kept until next init)

typedef bool (*zt_setup_fn)(zt_config *cfg);
typedef bool (*zt_change_fn)(zt_change *c);
// What ZT_EXPORT's exports call; public so tests can run a transform on a batch natively.
bool zt_run_init(zt_setup_fn setup, transform_list_tuple2_string_string_t *config, transform_string_t *err);
bool zt_run(zt_change_fn change, transform_batch_t *batch, transform_output_t *ret, transform_string_t *err);

#define ZT_EXPORT(setup, change)                                                               \
  bool exports_transform_init(transform_list_tuple2_string_string_t *config, transform_string_t *err) { \
    return zt_run_init((setup), config, err);                                                \
  }                                                                                          \
  bool exports_transform_transform(transform_batch_t *batch, transform_output_t *ret,        \
                                   transform_string_t *err) {                                \
    return zt_run((change), batch, ret, err);                                                \
  }

#endif  // ZIPLINE_TRANSFORM_H

#if defined(ZIPLINE_TRANSFORM_IMPLEMENTATION) && !defined(ZT__IMPLEMENTED)
#define ZT__IMPLEMENTED
// The implementation, in two parts so that no file grows past what one reads at once: the
// batch's types, text formatting, config and init; then reading, writing and running.
#include "impl/core.h"
#include "impl/change.h"
#endif  // ZIPLINE_TRANSFORM_IMPLEMENTATION
