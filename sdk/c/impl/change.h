// Part of zipline_transform.h's implementation (included there after impl/core.h): reading
// and writing one change, and running a batch.

// ---- reading ----

static const zt__table *zt__shape(const zt_change *c) { return &c->o->tables[c->raw.table]; }
zt_op zt_op_of(const zt_change *c) { return (zt_op)c->raw.op; }
zt_str zt_schema(const zt_change *c) { return zt__s(zt__shape(c)->schema); }
zt_str zt_table_name(const zt_change *c) { return zt__s(zt__shape(c)->name); }
size_t zt_ncolumns(const zt_change *c) { return zt__shape(c)->columns.len; }
zt_str zt_column_name(const zt_change *c, size_t i) { return zt__s(zt__shape(c)->columns.ptr[i].name); }
zipline_transform_types_position_t zt_position(const zt_change *c) { return c->raw.position; }
bool zt_is_table(const zt_change *c, const char *name) {
  const char *dot = strchr(name, '.');
  if (!dot) return zt_str_eq(zt_table_name(c), name);
  zt_str schema = zt_schema(c);
  return schema.len == (size_t)(dot - name) && !memcmp(schema.ptr, name, schema.len) &&
         zt_str_eq(zt_table_name(c), dot + 1);
}

static int64_t zt__index(const zt_change *c, zt_col col) {
  const zipline_transform_types_list_column_t *cols = &zt__shape(c)->columns;
  if (!col.name) return col.index >= 0 && (size_t)col.index < cols->len ? col.index : -1;
  for (size_t i = 0; i < cols->len; i++)
    if (zt_str_eq(zt__s(cols->ptr[i].name), col.name)) return (int64_t)i;
  return -1;
}
// The index of col, or -1 with the change's refusal message naming it.
static int64_t zt__need(zt_change *c, zt_col col) {
  int64_t i = zt__index(c, col);
  zt_str s = zt_schema(c), t = zt_table_name(c);
  if (i < 0 && col.name) zt_refuse(c, "%.*s.%.*s has no column \"%s\"", (int)s.len, s.ptr, (int)t.len, t.ptr, col.name);
  else if (i < 0) zt_refuse(c, "%.*s.%.*s has no column %lld", (int)s.len, s.ptr, (int)t.len, t.ptr, (long long)col.index);
  return i;
}
bool zt_has_column_(zt_change *c, zt_col col) { return zt__index(c, col) >= 0; }

// Column i's position among the key columns, or -1.
static int64_t zt__keypos(const zt_change *c, size_t i) {
  const zt__column *cols = zt__shape(c)->columns.ptr;
  if (!cols[i].is_key) return -1;
  int64_t k = 0;
  for (size_t j = 0; j < i; j++) k += cols[j].is_key;
  return k;
}
// Where column i's value is: the row, or for a delete the key.
static bool zt__slot(const zt_change *c, size_t i, size_t *slot) {
  int64_t k = zt__keypos(c, i);
  if (i < c->raw.values.len) *slot = c->raw.values.start + i;
  else if (k >= 0 && (size_t)k < c->raw.key.len) *slot = c->raw.key.start + (size_t)k;
  else return false;
  return true;
}
// Every slot holding column i (each once): row, key and, with old_key, the old key.
static size_t zt__slots(const zt_change *c, size_t i, bool old_key, size_t out[3]) {
  size_t n = 0;
  int64_t k = zt__keypos(c, i);
  if (i < c->raw.values.len) out[n++] = c->raw.values.start + i;
  zt__span spans[2] = {c->raw.key, c->raw.old_key.val};
  for (int s = 0; k >= 0 && s < 1 + (old_key && c->raw.old_key.is_some); s++) {
    if ((size_t)k >= spans[s].len) continue;
    size_t slot = spans[s].start + (size_t)k, j = 0;
    while (j < n && out[j] != slot) j++;
    if (j == n) out[n++] = slot;
  }
  return n;
}

static bool zt__bytes(zt_change *c, zt__span s, zt_str *out) {
  zt__out *o = c->o;
  uint64_t end = (uint64_t)s.start + s.len;
  *out = (zt_str){"", 0};
  if (!s.len && end <= o->base + o->dlen) return true;
  if (s.start >= o->base && end - o->base <= o->dlen) *out = (zt_str){(char *)o->data + (s.start - o->base), s.len};
  else if (end <= o->base) *out = (zt_str){(char *)o->in->data.ptr + s.start, s.len};
  else return zt_fail_batch(c, "change %u: data span %u+%u is out of range", c->index, s.start, s.len);
  return true;
}
static zt__span *zt__span_of(zt__val *w) { return w->tag == ZT_OTHER ? &w->val.other.text : &w->val.text; }
#define ZT__HAS_SPAN(tag) (ZT__SPAN_KINDS >> (tag) & 1)

static bool zt__decode(zt_change *c, zt__val *w, zt_value *v) {
  *v = (zt_value){.kind = (zt_kind)w->tag};
  switch (w->tag) {
    case ZT_BOOL: v->b = w->val.boolean; break;
    case ZT_INT2: v->i = w->val.int2; break;
    case ZT_INT4: v->i = w->val.int4; break;
    case ZT_DATE: v->i = w->val.date; break;
    case ZT_INT8: case ZT_TIME: case ZT_TIMESTAMP: case ZT_TIMESTAMPTZ: v->i = w->val.int8; break;
    case ZT_FLOAT4: v->f = w->val.float4; break;
    case ZT_FLOAT8: v->f = w->val.float8; break;
    case ZT_UUID: v->uuid[0] = w->val.uuid.f0, v->uuid[1] = w->val.uuid.f1; break;
    case ZT_OTHER: v->oid = w->val.other.type_oid; break;
  }
  return !ZT__HAS_SPAN(w->tag) || zt__bytes(c, *zt__span_of(w), &v->s);
}

bool zt_get_(zt_change *c, zt_col col, zt_value *out) {
  int64_t i = zt__index(c, col);
  size_t slot;
  *out = zt_null();
  return i >= 0 && zt__slot(c, (size_t)i, &slot) && zt__decode(c, &c->o->values[slot], out);
}
int zt_kind_of_(zt_change *c, zt_col col) {
  int64_t i = zt__index(c, col);
  size_t slot;
  return i >= 0 && zt__slot(c, (size_t)i, &slot) ? c->o->values[slot].tag : -1;
}
bool zt_is_null_(zt_change *c, zt_col col) { return zt_kind_of_(c, col) == ZT_NULL; }
bool zt_get_str_(zt_change *c, zt_col col, zt_str *out) {
  zt_value v;
  bool ok = zt_get_(c, col, &v) && ZT__HAS_SPAN(v.kind) && v.kind != ZT_BYTES;
  *out = ok ? v.s : (zt_str){"", 0};
  return ok;
}
static bool zt__is_int(zt_kind k) { return k == ZT_INT2 || k == ZT_INT4 || k == ZT_INT8; }
bool zt_get_int_(zt_change *c, zt_col col, int64_t *out) {
  zt_value v;
  bool ok = zt_get_(c, col, &v) && zt__is_int(v.kind);
  *out = ok ? v.i : 0;
  return ok;
}
bool zt_get_float_(zt_change *c, zt_col col, double *out) {
  zt_value v;
  bool ok = zt_get_(c, col, &v) && (zt__is_int(v.kind) || v.kind == ZT_FLOAT4 || v.kind == ZT_FLOAT8);
  *out = !ok ? 0 : zt__is_int(v.kind) ? (double)v.i : v.f;
  return ok;
}
bool zt_get_bool_(zt_change *c, zt_col col, bool *out) {
  zt_value v;
  bool ok = zt_get_(c, col, &v) && v.kind == ZT_BOOL;
  *out = ok && v.b;
  return ok;
}

// ---- writing ----

// Appends bytes to the output's data and returns their span; bytes already in the batch's
// data keep theirs. An outgrown buffer is retired, not freed: strings read from it stay valid.
static zt__span zt__append(zt_change *c, const void *p, size_t n) {
  zt__out *o = c->o;
  const uint8_t *b = p;
  if (!n) return (zt__span){o->base, 0};
  if (b >= o->in->data.ptr && o->base && b + n <= o->in->data.ptr + o->base)
    return (zt__span){(uint32_t)(b - o->in->data.ptr), (uint32_t)n};
  if (o->dlen && b >= o->data && b + n <= o->data + o->dlen)
    return (zt__span){o->base + (uint32_t)(b - o->data), (uint32_t)n};
  if ((uint64_t)o->base + o->dlen + n > UINT32_MAX) {
    zt_fail_batch(c, "output data would pass 4 GiB");
    return (zt__span){o->base, 0};
  }
  if (o->dlen + n > o->dcap) {
    size_t cap = o->dcap * 2 > o->dlen + n ? o->dcap * 2 : o->dlen + n + 256;
    uint8_t *grown = zt__alloc(cap);
    if (o->dlen) memcpy(grown, o->data, o->dlen);
    if (o->dcap) ZT__PUSH(o, retired, nretired, cretired, o->data);
    o->data = grown, o->dcap = cap;
  }
  memcpy(o->data + o->dlen, b, n);
  o->dlen += n;
  return (zt__span){o->base + (uint32_t)(o->dlen - n), (uint32_t)n};
}

static bool zt__lower_int(zt_change *c, const zt__column *col, int64_t n, zt__val *w) {
  uint32_t oid = col->type_oid;
  bool fits = oid == 21 ? n >= INT16_MIN && n <= INT16_MAX : oid == 23 || oid == 1082 ? n >= INT32_MIN && n <= INT32_MAX : true;
  if (!fits) return zt_refuse(c, "%lld does not fit column %.*s", (long long)n, (int)col->name.len, col->name.ptr);
  switch (oid) {
    case 21: w->tag = ZT_INT2, w->val.int2 = (int16_t)n; break;
    case 23: w->tag = ZT_INT4, w->val.int4 = (int32_t)n; break;
    case 1082: w->tag = ZT_DATE, w->val.date = (int32_t)n; break;
    case 1083: w->tag = ZT_TIME, w->val.time = n; break;
    case 1114: w->tag = ZT_TIMESTAMP, w->val.timestamp = n; break;
    case 1184: w->tag = ZT_TIMESTAMPTZ, w->val.timestamptz = n; break;
    case 700: w->tag = ZT_FLOAT4, w->val.float4 = (float)n; break;
    case 701: w->tag = ZT_FLOAT8, w->val.float8 = (double)n; break;
    case 1700: {
      char buf[24];
      w->tag = ZT_NUMERIC, w->val.numeric = zt__append(c, buf, zt__sprint(buf, sizeof buf, "%lld", (long long)n));
      break;
    }
    default: w->tag = ZT_INT8, w->val.int8 = n;
  }
  return !c->o->failed;
}

static int zt__hex(char ch) {
  return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

// Types whose text is written as `text` (others as `other`, with their type OID).
static bool zt__texty(uint32_t oid) {
  switch (oid) {
    case 16: case 17: case 19: case 20: case 21: case 23: case 25: case 700: case 701: case 1042:
    case 1043: case 1082: case 1083: case 1114: case 1184: return true;
  }
  return false;
}

// The contract's form of v for column col, whose value is now cur (if any).
static bool zt__lower(zt_change *c, const zt__column *col, zt_value v, const zt__val *cur, zt__val *w) {
  memset(w, 0, sizeof *w);
  w->tag = (uint8_t)v.kind;
  zt_kind kind = v.kind;
  uint32_t oid = col->type_oid;
  switch (v.kind) {
    case ZT_NULL: case ZT_UNCHANGED: return true;
    case ZT_BOOL: w->val.boolean = v.b; return true;
    case ZT_INT2: case ZT_INT4: case ZT_INT8: return zt__lower_int(c, col, v.i, w);
    case ZT_DATE: w->val.date = (int32_t)v.i; return true;
    case ZT_TIME: case ZT_TIMESTAMP: case ZT_TIMESTAMPTZ: w->val.int8 = v.i; return true;
    case ZT_UUID: w->val.uuid.f0 = v.uuid[0], w->val.uuid.f1 = v.uuid[1]; return true;
    case ZT_FLOAT4: case ZT_FLOAT8:
      if (oid == 20 || oid == 21 || oid == 23) {
        if (!(v.f >= -9223372036854775808.0 && v.f < 9223372036854775808.0) || v.f != (double)(int64_t)v.f)
          return zt_refuse(c, "a fraction does not fit integer column %.*s", (int)col->name.len, col->name.ptr);
        return zt__lower_int(c, col, (int64_t)v.f, w);
      }
      if (oid == 1700) return zt_refuse(c, "column %.*s is numeric: set its text", (int)col->name.len, col->name.ptr);
      if (oid == 700 || (oid != 701 && v.kind == ZT_FLOAT4)) w->tag = ZT_FLOAT4, w->val.float4 = (float)v.f;
      else w->tag = ZT_FLOAT8, w->val.float8 = v.f;
      return true;
    case ZT_TEXT:
      // A string takes the kind of the value it replaces, else the column type's.
      if (cur && cur->tag != ZT_NULL && cur->tag != ZT_UNCHANGED) kind = (zt_kind)cur->tag;
      else if (oid == 114 || oid == 3802) kind = ZT_JSON;
      else if (oid == 1700) kind = ZT_NUMERIC;
      else if (oid == 2950) kind = ZT_UUID;
      else if (!zt__texty(oid)) kind = ZT_OTHER;
      if (kind == ZT_UUID) {
        uint64_t u[2] = {0, 0};
        int digits = 0;
        for (size_t i = 0; i < v.s.len; i++) {
          int h = zt__hex(v.s.ptr[i]);
          if (h < 0 && v.s.ptr[i] == '-') continue;
          if (h < 0 || digits == 32) { digits = -1; break; }
          u[digits / 16] = u[digits / 16] << 4 | (uint64_t)h, digits++;
        }
        if (digits != 32) return zt_refuse(c, "column %.*s: `%.*s` is not a UUID", (int)col->name.len, col->name.ptr, (int)v.s.len, v.s.ptr);
        w->tag = ZT_UUID, w->val.uuid.f0 = u[0], w->val.uuid.f1 = u[1];
        return true;
      }
      if (!ZT__HAS_SPAN(kind) || kind == ZT_BYTES) kind = ZT_TEXT;
      if (kind == ZT_OTHER) v.oid = cur && cur->tag == ZT_OTHER ? cur->val.other.type_oid : oid;
      w->tag = (uint8_t)kind;
      // fall through
    case ZT_NUMERIC: case ZT_BYTES: case ZT_JSON: case ZT_OTHER:
      if (kind == ZT_OTHER) w->val.other.type_oid = v.oid ? v.oid : oid;
      *zt__span_of(w) = zt__append(c, v.s.ptr, v.s.len);
      return !c->o->failed;
  }
  return zt_refuse(c, "column %.*s: no value kind %d", (int)col->name.len, col->name.ptr, (int)v.kind);
}

bool zt_set_(zt_change *c, zt_col col, zt_value v) {
  int64_t i = zt__need(c, col);
  size_t slot, slots[3];
  if (i < 0) return false;
  zt__val w;
  const zt__val *cur = zt__slot(c, (size_t)i, &slot) ? &c->o->values[slot] : NULL;
  if (!zt__lower(c, &zt__shape(c)->columns.ptr[i], v, cur, &w)) return false;
  for (size_t n = zt__slots(c, (size_t)i, false, slots), j = 0; j < n; j++) c->o->values[slots[j]] = w;
  return true;
}

bool zt_map_(zt_change *c, zt_col col, unsigned kinds, zt_map_fn f, void *ctx) {
  int64_t i = zt__need(c, col);
  size_t slots[3];
  if (i < 0) return false;
  for (size_t n = zt__slots(c, (size_t)i, true, slots), j = 0; j < n; j++) {
    zt__val *w = &c->o->values[slots[j]];
    zt_str in, out;
    if (!(kinds >> w->tag & 1) || !ZT__HAS_SPAN(w->tag)) continue;
    if (!zt__bytes(c, *zt__span_of(w), &in)) return false;
    out = f(in, (zt_kind)w->tag, ctx);
    if (out.ptr == in.ptr && out.len == in.len) continue;  // unchanged: keeps its span
    zt__span s = zt__append(c, out.ptr, out.len);
    if (c->o->failed) return false;
    *zt__span_of(&c->o->values[slots[j]]) = s;
  }
  return true;
}

void zt_drop(zt_change *c) { c->dropped = true; }
void zt_keep(zt_change *c) { c->dropped = false; }
bool zt_dropped(const zt_change *c) { return c->dropped; }

static bool zt__same_table(const zt__table *a, const zt__table *b) {
  if (!zt__eq(a->schema, b->schema) || !zt__eq(a->name, b->name) || a->columns.len != b->columns.len) return false;
  for (size_t i = 0; i < a->columns.len; i++) {
    const zt__column *x = &a->columns.ptr[i], *y = &b->columns.ptr[i];
    if (!zt__eq(x->name, y->name) || x->type_oid != y->type_oid || x->type_modifier != y->type_modifier || x->is_key != y->is_key)
      return false;
  }
  return true;
}
static void zt__free_table(zt__table *t) {
  if (t->schema.len) free(t->schema.ptr);
  if (t->name.len) free(t->name.ptr);
  for (size_t i = 0; i < t->columns.len; i++)
    if (t->columns.ptr[i].name.len) free(t->columns.ptr[i].name.ptr);
  if (t->columns.len) free(t->columns.ptr);
}
// The index of a table equal to t among the output's tables; with `copy`, a deep copy of t
// is listed when there is none.
static int64_t zt__find_table(zt__out *o, const zt__table *t, bool copy) {
  for (size_t i = 0; i < o->tlen; i++)
    if (zt__same_table(&o->tables[i], t)) return (int64_t)i;
  if (!copy) return -1;
  zt__table n = {zt__dup(t->schema.ptr, t->schema.len), zt__dup(t->name.ptr, t->name.len), {NULL, t->columns.len}};
  if (n.columns.len) n.columns.ptr = zt__alloc(n.columns.len * sizeof *n.columns.ptr);
  for (size_t i = 0; i < n.columns.len; i++)
    n.columns.ptr[i] = t->columns.ptr[i], n.columns.ptr[i].name = zt__dup(t->columns.ptr[i].name.ptr, t->columns.ptr[i].name.len);
  ZT__PUSH(o, tables, tlen, tcap, n);
  return (int64_t)(o->tlen - 1);
}
// A table as the contract's type, its strings borrowed (never freed: see zt__find_table).
static transform_string_t zt__borrow(const char *s) { return (transform_string_t){(uint8_t *)s, strlen(s)}; }
// Gives c the shape of edit `edit` of its table, built once per batch.
static void zt__reshape(zt_change *c, char edit, size_t col, const char *schema, const char *name) {
  zt__out *o = c->o;
  for (size_t i = 0; i < o->rlen; i++) {
    const zt__table *to = &o->tables[o->reshaped[i].to];
    if (o->reshaped[i].from != c->raw.table || o->reshaped[i].edit != edit || o->reshaped[i].col != col) continue;
    if (edit == 'd' || (edit == 'c' && zt_str_eq(zt__s(to->columns.ptr[col].name), name)) ||
        (edit == 't' && zt_str_eq(zt__s(to->schema), schema) && zt_str_eq(zt__s(to->name), name)))
      return (void)(c->raw.table = o->reshaped[i].to);
  }
  // The edited shape, borrowing the current one's strings, then listed as a copy.
  zt__table n = *zt__shape(c);
  zt__column *cols = zt__alloc(n.columns.len * sizeof *cols);
  memcpy(cols, n.columns.ptr, n.columns.len * sizeof *cols);
  n.columns.ptr = cols;
  if (edit == 't') n.schema = zt__borrow(schema), n.name = zt__borrow(name);
  if (edit == 'c') cols[col].name = zt__borrow(name);
  if (edit == 'd') memmove(&cols[col], &cols[col + 1], (--n.columns.len - col) * sizeof *cols);
  uint32_t from = c->raw.table, to = (uint32_t)zt__find_table(o, &n, true);
  free(cols);
  zt__grow((void **)&o->reshaped, &o->rcap, o->rlen, 1, sizeof *o->reshaped);
  o->reshaped[o->rlen].from = from, o->reshaped[o->rlen].to = to, o->reshaped[o->rlen].edit = edit, o->reshaped[o->rlen++].col = col;
  c->raw.table = to;
}
void zt_rename_table(zt_change *c, const char *schema, const char *name) { zt__reshape(c, 't', 0, schema, name); }
bool zt_rename_column_(zt_change *c, zt_col col, const char *name) {
  int64_t i = zt__need(c, col);
  if (i >= 0) zt__reshape(c, 'c', (size_t)i, NULL, name);
  return i >= 0;
}
// Appends n values (copies of `from`, or of `row` when given) to the values list.
static zt__span zt__push_values(zt__out *o, size_t from, const zt__val *row, size_t n) {
  zt__grow((void **)&o->values, &o->vcap, o->vlen, n, sizeof *o->values);
  if (n) memcpy(&o->values[o->vlen], row ? row : &o->values[from], n * sizeof *o->values);
  o->vlen += n;
  return (zt__span){(uint32_t)(o->vlen - n), (uint32_t)n};
}
bool zt_drop_column_(zt_change *c, zt_col col) {
  int64_t i = zt__need(c, col);
  if (i < 0) return false;
  const zt__column *column = &zt__shape(c)->columns.ptr[i];
  if (column->is_key) return zt_refuse(c, "cannot drop key column %.*s", (int)column->name.len, column->name.ptr);
  zt__span row = c->raw.values;
  if ((size_t)i < row.len) {
    // The row without it goes to the end of the list: copies emitted earlier keep theirs.
    zt__span s = zt__push_values(c->o, row.start, NULL, row.len);
    memmove(&c->o->values[s.start + i], &c->o->values[s.start + i + 1], (row.len - (size_t)i - 1) * sizeof(zt__val));
    c->o->vlen--, s.len--;
    c->raw.values = s;
  }
  zt__reshape(c, 'd', (size_t)i, NULL, NULL);
  return true;
}
void zt_emit_copy(zt_change *c, const char *schema, const char *name) {
  zt__out *o = c->o;
  zt__raw copy = c->raw;
  zt__table t = *zt__shape(c);
  t.schema = zt__borrow(schema), t.name = zt__borrow(name);
  copy.table = (uint32_t)zt__find_table(o, &t, true);
  copy.key = zt__push_values(o, c->raw.key.start, NULL, c->raw.key.len);
  if (copy.old_key.is_some) copy.old_key.val = zt__push_values(o, c->raw.old_key.val.start, NULL, c->raw.old_key.val.len);
  copy.values = zt__push_values(o, c->raw.values.start, NULL, c->raw.values.len);
  ZT__PUSH(o, changes, clen, ccap, copy);
}
bool zt_emit(zt_change *c, zt_op op, const zt_table *t, const zt_value *values) {
  zt__out *o = c->o;
  if ((unsigned)op > ZT_TRUNCATE) return zt_refuse(c, "emit into %s.%s: no op %d", t->schema, t->name, (int)op);
  zt__table n = {zt__borrow(t->schema), zt__borrow(t->name), {zt__alloc(t->ncolumns * sizeof(zt__column)), t->ncolumns}};
  for (size_t i = 0; i < t->ncolumns; i++)
    n.columns.ptr[i] = (zt__column){zt__borrow(t->columns[i].name), t->columns[i].type_oid, t->columns[i].type_modifier,
                                    t->columns[i].is_key};
  zt__val *row = zt__alloc(t->ncolumns * 2 * sizeof *row), *key = row + t->ncolumns;
  size_t nkey = 0;
  bool ok = true;
  for (size_t i = 0; ok && i < t->ncolumns; i++)
    if ((ok = zt__lower(c, &n.columns.ptr[i], values[i], NULL, &row[i])) && t->columns[i].is_key) key[nkey++] = row[i];
  if (ok) {
    bool whole = op == ZT_INSERT || op == ZT_UPDATE;
    zt__span r = zt__push_values(o, 0, row, whole ? t->ncolumns : 0);
    zt__span k = zt__push_values(o, 0, key, op == ZT_TRUNCATE ? 0 : nkey);
    zt__raw e = {(uint32_t)zt__find_table(o, &n, true), (uint8_t)op, c->raw.position, k, {false, {0, 0}}, r};
    ZT__PUSH(o, changes, clen, ccap, e);
  }
  free(n.columns.ptr);
  free(row);
  return ok;
}

void zt_filter(zt_change *c, bool (*keep)(zt_change *row, void *ctx), void *ctx) {
  if (c->raw.op == ZT_INSERT && !keep(c, ctx)) c->dropped = true;
  if (c->raw.op != ZT_UPDATE || keep(c, ctx)) return;
  // The row may have matched before: delete it by the key it had.
  c->raw.op = ZT_DELETE;
  if (c->raw.old_key.is_some) c->raw.key = c->raw.old_key.val;
  c->raw.old_key.is_some = false;
  c->raw.values.len = 0;
}

// ---- running a batch ----

static void zt__free_output(zt__out *o) {
  for (size_t i = 0; i < o->tlen; i++) zt__free_table(&o->tables[i]);
  if (o->tcap) free(o->tables);
  if (o->vcap) free(o->values);
  if (o->dcap) free(o->data);
  for (size_t i = 0; i < o->elen; i++) free(o->errors[i].message.len ? o->errors[i].message.ptr : NULL);
  free(o->errors);
  free(o->changes);
}

bool zt_run(zt_change_fn change, transform_batch_t *batch, transform_output_t *ret, transform_string_t *err) {
  zt__out o = {.in = batch, .base = (uint32_t)batch->data.len,
               .values = batch->values.ptr, .vlen = batch->values.len, .vcap = batch->values.len,
               .tables = batch->tables.ptr, .tlen = batch->tables.len, .tcap = batch->tables.len};
  zt_change c = {.o = &o};
  memset(ret, 0, sizeof *ret);
  if (!zt__ready) zt_fail_batch(&c, "transform called before init");
  if (batch->data.len > UINT32_MAX) zt_fail_batch(&c, "batch data past 4 GiB");
  // Checked once, so that nothing after reads out of bounds.
  for (size_t i = 0; !o.failed && i < batch->changes.len; i++) {
    const zt__raw *r = &batch->changes.ptr[i];
    zt__span spans[3] = {r->values, r->key, r->old_key.val};
    const char *what[3] = {"values", "key", "old-key"};
    if (r->table >= o.tlen) zt_fail_batch(&c, "change %zu refers to table #%u of %zu", i, r->table, o.tlen);
    for (int s = 0; !o.failed && s < 2 + r->old_key.is_some; s++)
      if ((uint64_t)spans[s].start + spans[s].len > o.vlen)
        zt_fail_batch(&c, "change %zu: %s span %u+%u is out of range", i, what[s], spans[s].start, spans[s].len);
  }
  if (!o.failed) o.ccap = batch->changes.len, o.changes = zt__alloc(o.ccap * sizeof *o.changes);
  for (size_t i = 0; !o.failed && i < batch->changes.len; i++) {
    size_t mark = o.clen;
    c = (zt_change){.o = &o, .raw = batch->changes.ptr[i], .index = (uint32_t)i};
    bool ok = change(&c);
    if (o.failed) break;
    if (!ok) {
      o.clen = mark;  // what it emitted goes with it
      const char *msg = c.has_msg ? c.msg : "refused by the transform";
      ZT__PUSH(&o, errors, elen, ecap, ((zt__error){(uint32_t)i, zt__dup(msg, strlen(msg))}));
    } else if (!c.dropped) {  // before what it emitted
      zt__grow((void **)&o.changes, &o.ccap, o.clen, 1, sizeof *o.changes);
      memmove(&o.changes[mark + 1], &o.changes[mark], (o.clen++ - mark) * sizeof *o.changes);
      o.changes[mark] = c.raw;
    }
  }
  // The input's bytes and changes are not returned (spans into the data still address the
  // host's copy): ours to free.
  if (batch->data.len) free(batch->data.ptr);
  if (batch->changes.len) free(batch->changes.ptr);
  while (o.nretired) free(o.retired[--o.nretired]);
  free(o.retired);
  free(o.reshaped);
  if (o.failed) {
    zt__free_output(&o);
    *err = zt__dup(o.fail, strlen(o.fail));
    return false;
  }
  if (!o.clen) {
    // Nothing refers to the tables, values or new bytes: return empty lists.
    zt__error *errors = o.errors;
    size_t elen = o.elen;
    o.errors = NULL, o.elen = 0;
    zt__free_output(&o);
    o = (zt__out){.errors = errors, .elen = elen};
  }
  // The post-return frees a list only when len > 0: an empty one of ours would leak.
  if (!o.elen) free(o.errors), o.errors = NULL;
  if (!o.clen) free(o.changes), o.changes = NULL;
  ret->tables = (zipline_transform_types_list_table_t){o.tables, o.tlen};
  ret->data = (transform_list_u8_t){o.data, o.dlen};
  ret->values = (zipline_transform_types_list_value_t){o.values, o.vlen};
  ret->changes = (zipline_transform_types_list_change_t){o.changes, o.clen};
  ret->errors = (zipline_transform_types_list_change_error_t){o.errors, o.elen};
  return true;
}
