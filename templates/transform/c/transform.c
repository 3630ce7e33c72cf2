// __NAME__: keeps only the rows whose `column` is not `value` (both from the route's config).
// Filtered tables need `row_filter: true` on the route's transform and REPLICA IDENTITY FULL.
#define ZIPLINE_TRANSFORM_IMPLEMENTATION
#include "zipline_transform.h"

#include <ctype.h>
#include <string.h>

static const char *COLUMN, *VALUE;

// The value of a required key, trimmed and NUL-terminated; NULL (and the message) when unset.
static const char *require(zt_config *cfg, const char *key) {
  zt_str s = zt_config_get(cfg, key, NULL);
  if (!s.ptr) return zt_fail(cfg, "config `%s` is required", key), NULL;
  while (s.len && isspace((unsigned char)s.ptr[0])) s.ptr++, s.len--;
  while (s.len && isspace((unsigned char)s.ptr[s.len - 1])) s.len--;
  return strndup(s.ptr, s.len);
}

static bool setup(zt_config *cfg) {
  if (!zt_config_allow_only(cfg, "column", "value", NULL)) return false;
  COLUMN = require(cfg, "column");
  return COLUMN && (VALUE = require(cfg, "value"));
}

static bool keep(zt_change *row, void *ctx) {
  zt_str s;
  return (void)ctx, !(zt_get_str(row, COLUMN, &s) && zt_str_eq(s, VALUE));
}

// An insert failing `keep` is dropped, an update failing it deletes the row.
static bool change(zt_change *c) { return zt_filter(c, keep, NULL), true; }

ZT_EXPORT(setup, change)
