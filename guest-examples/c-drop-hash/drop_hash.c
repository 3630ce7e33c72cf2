// A Zipline transform in C, on sdk/c: drops the configured tables and replaces the configured
// columns by a hash (64-bit FNV-1a, 16 lower-case hex digits).
//
// Config (the route's `transform.config` map):
//   drop  comma-separated tables whose changes are dropped: `schema.table`, or a bare
//         `table` for any schema
//   hash  comma-separated column names (in every table) whose values are hashed
//
// A hashed `text` becomes the hex digits of the hash of its UTF-8 bytes; `other` values are
// hashed the same way (their text form); `bytes` become the 8 bytes of the hash, big-endian.
// Every other variant (NULL, numbers, dates, `unchanged`, ...) passes as it is: a hash of a
// number would no longer fit its column. zt_map rewrites a key column in `key` and `old-key`
// too, so updates and deletes still find the row the insert wrote. The SDK does the rest:
// untouched changes and values pass without copying, the hashes are the only new bytes.
#define ZIPLINE_TRANSFORM_IMPLEMENTATION
#include "zipline_transform.h"

// The limit is the hand-written version's: more names is an init error, as it was.
#define MAX_ITEMS 64
static zt_list DROP, HASH;

static bool setup(zt_config *cfg) {
  if (!zt_config_allow_only(cfg, "drop", "hash", NULL)) return false;
  DROP = zt_config_list(cfg, "drop");
  HASH = zt_config_list(cfg, "hash");
  const char *over = DROP.len > MAX_ITEMS ? "drop" : HASH.len > MAX_ITEMS ? "hash" : NULL;
  if (over) return zt_fail(cfg, "config key `%s` lists more than %d names", over, MAX_ITEMS);
  zt_log(ZT_INFO, "c-drop-hash: dropping %zu table(s), hashing %zu column(s)", DROP.len, HASH.len);
  return true;
}

// f for zt_map: returning s unchanged keeps the value (numeric and json are not hashed).
static zt_str hash(zt_str s, zt_kind kind, void *ctx) {
  static char out[16];  // zt_map copies the result at once
  (void)ctx;
  if (kind != ZT_TEXT && kind != ZT_OTHER && kind != ZT_BYTES) return s;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < s.len; i++) h = (h ^ (uint8_t)s.ptr[i]) * 0x100000001b3ULL;
  for (int i = 0; i < 16; i++) out[i] = "0123456789abcdef"[h >> (60 - 4 * i) & 0xf];
  if (kind == ZT_BYTES)
    for (int i = 0; i < 8; i++) out[i] = (char)(h >> (56 - 8 * i));
  return (zt_str){out, kind == ZT_BYTES ? 8 : 16};
}

static bool change(zt_change *c) {
  for (size_t i = 0; i < DROP.len; i++)
    if (zt_is_table(c, DROP.items[i])) return zt_drop(c), true;
  // Column by column, so a name listed twice is still hashed once.
  for (size_t col = 0; col < zt_ncolumns(c); col++)
    for (size_t i = 0; i < HASH.len; i++)
      if (zt_str_eq(zt_column_name(c, col), HASH.items[i])) {
        if (!zt_map(c, col, hash, NULL)) return false;
        break;
      }
  return true;
}

ZT_EXPORT(setup, change)
