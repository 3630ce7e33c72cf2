package transform

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	exports "zipline/transform/wit/export_wit_world"
	types "zipline/transform/wit/zipline_transform_types"

	witTypes "go.bytecodealliance.org/pkg/wit/types"
)

type fn = Func

var users = types.Table{Schema: "public", Name: "users", Columns: []types.Column{
	{Name: "id", TypeOid: oidInt4, TypeModifier: -1, IsKey: true},
	{Name: "email", TypeOid: oidText, TypeModifier: -1},
	{Name: "score", TypeOid: oidInt8, TypeModifier: -1},
	{Name: "tags", TypeOid: oidJSONB, TypeModifier: -1},
	{Name: "blob", TypeOid: oidBytea, TypeModifier: -1},
}}

// builder lays a batch out as the host does.
type builder struct{ b types.Batch }

func newBuilder(tables ...types.Table) *builder {
	return &builder{types.Batch{Tables: tables}}
}

func (b *builder) span(s string) types.Span {
	start := uint32(len(b.b.Data))
	b.b.Data = append(b.b.Data, s...)
	return types.Span{Start: start, Len: uint32(len(s))}
}

func (b *builder) text(s string) types.Value  { return types.MakeValueText(b.span(s)) }
func (b *builder) json(s string) types.Value  { return types.MakeValueJson(b.span(s)) }
func (b *builder) bytes(s string) types.Value { return types.MakeValueBytes(b.span(s)) }

func (b *builder) values(vs []types.Value) types.Span {
	start := uint32(len(b.b.Values))
	b.b.Values = append(b.b.Values, vs...)
	return types.Span{Start: start, Len: uint32(len(vs))}
}

func (b *builder) change(table uint32, op Op, ordinal uint32, key, oldKey, row []types.Value) {
	c := types.Change{Table: table, Op: uint8(op), OldKey: witTypes.None[types.Span](),
		Position: types.Position{LsnLow: 0x7000028, Ordinal: ordinal}}
	c.Key = b.values(key)
	if oldKey != nil {
		c.OldKey = witTypes.Some(b.values(oldKey))
	}
	c.Values = b.values(row)
	b.b.Changes = append(b.b.Changes, c)
}

// user adds a change of users with id and email (score 7, tags [1], blob \x01).
func (b *builder) user(op Op, id int32, email string, oldID ...int32) {
	key := []types.Value{types.MakeValueInt4(id)}
	var old []types.Value
	if len(oldID) > 0 {
		old = []types.Value{types.MakeValueInt4(oldID[0])}
	}
	var row []types.Value
	if op == Insert || op == Update {
		row = []types.Value{types.MakeValueInt4(id), b.text(email), types.MakeValueInt8(7),
			b.json("[1]"), b.bytes("\x01")}
	}
	if op == Truncate {
		key = nil
	}
	b.change(0, op, uint32(len(b.b.Changes)+1), key, old, row)
}

// show renders an output change as `schema.table op key=[...] old=[...] row=[...]`.
func show(in types.Batch, o types.Output, c types.Change) string {
	data := append(append([]byte(nil), in.Data...), o.Data...)
	render := func(s types.Span) string {
		var parts []string
		for _, w := range o.Values[s.Start : s.Start+s.Len] {
			v := (&out{input: data, base: uint32(len(data))}).decode(w)
			parts = append(parts, v.kind.String()+":"+Value{&v}.String())
		}
		return "[" + strings.Join(parts, " ") + "]"
	}
	t := o.Tables[c.Table]
	s := fmt.Sprintf("%s.%s %v key=%s", t.Schema, t.Name, Op(c.Op), render(c.Key))
	if c.OldKey.IsSome() {
		s += " old=" + render(c.OldKey.Some())
	}
	return s + " row=" + render(c.Values)
}

func run(t *testing.T, b *builder, f fn) (types.Output, []string) {
	t.Helper()
	o, err := Run(f, b.b)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var lines []string
	for _, c := range o.Changes {
		lines = append(lines, show(b.b, o, c))
	}
	return o, lines
}

func want(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestUntouchedChangesGoOutAsTheyCame(t *testing.T) {
	b := newBuilder(users)
	b.user(Insert, 1, "a@x")
	b.user(Update, 2, "b@x", 1)
	b.user(Delete, 2, "")
	b.user(Truncate, 0, "")
	o, _ := run(t, b, func(c *Change) error {
		c.GetStr("email") // reading changes nothing
		return nil
	})
	if !reflect.DeepEqual(o.Changes, b.b.Changes) || !reflect.DeepEqual(o.Values, b.b.Values) {
		t.Fatal("changes or values differ from the input's")
	}
	if &o.Values[0] != &b.b.Values[0] || len(o.Data) != 0 || len(o.Errors) != 0 {
		t.Fatal("the input's values list was copied, or data was written")
	}
	if !reflect.DeepEqual(o.Tables, b.b.Tables) {
		t.Fatal("tables differ")
	}
}

func TestGetters(t *testing.T) {
	b := newBuilder(users)
	b.user(Insert, 1, "a@x")
	b.user(Delete, 2, "")
	b.user(Truncate, 0, "")
	var got []string
	run(t, b, func(c *Change) error {
		email, okEmail := c.GetStr("email")
		id, okID := c.GetInt(0)
		f, _ := c.GetFloat("score")
		k, _ := c.Kind("tags")
		_, okNone := c.Get("nowhere")
		_, okBad := c.Get(9)
		blob, _ := c.Get("blob")
		bs, _ := blob.Bytes()
		got = append(got, fmt.Sprintf("%v %q/%v %d/%v %v %v %v %v %q null=%v %s %v", c.Op(), email,
			okEmail, id, okID, f, k, okNone, okBad, bs, c.IsNull("email"), c.LSN(),
			c.IsTable("public.users") && c.IsTable("users") && !c.IsTable("x.users")))
		return nil
	})
	want(t, got,
		`insert "a@x"/true 1/true 7 json false false "\x01" null=false 0/7000028 true`,
		`delete ""/false 2/true 0 null false false "" null=false 0/7000028 true`,
		`truncate ""/false 0/false 0 null false false "" null=false 0/7000028 true`,
	)
}

func TestSettersFollowTheKeyAndWidth(t *testing.T) {
	b := newBuilder(users)
	b.user(Update, 2, "b@x", 1)
	b.user(Insert, 3, "c@x")
	b.user(Delete, 4, "")
	_, lines := run(t, b, func(c *Change) error {
		switch c.Position().Ordinal {
		case 1:
			if err := c.SetInt("id", 20); err != nil {
				return err
			}
			if err := c.SetStr("tags", "[2]"); err != nil { // stays json
				return err
			}
			return c.SetNull("email")
		case 2:
			return c.SetInt("id", 1<<40) // too wide for int4: refused
		}
		return c.SetInt(0, 40) // a delete's key column
	})
	want(t, lines,
		"public.users update key=[int4:20] old=[int4:1] row=[int4:20 null:NULL int8:7 json:[2] bytes:\\x01]",
		"public.users delete key=[int4:40] row=[]",
	)
	o, _ := Run(fn(func(c *Change) error { return c.SetInt("id", 1<<40) }), b.b)
	if len(o.Errors) != 3 || o.Errors[1].Index != 1 ||
		o.Errors[1].Message != "1099511627776 does not fit column id" {
		t.Errorf("errors: %+v", o.Errors)
	}
	o, _ = Run(fn(func(c *Change) error { return c.SetStr("nowhere", "") }), b.b)
	if o.Errors[0].Message != `public.users has no column "nowhere" (it has id, email, score, tags, blob)` {
		t.Errorf("errors: %+v", o.Errors)
	}
}

func TestMapStrRewritesKeyAndOldKey(t *testing.T) {
	keyed := types.Table{Schema: "public", Name: "people", Columns: []types.Column{
		{Name: "email", TypeOid: oidText, TypeModifier: -1, IsKey: true},
		{Name: "name", TypeOid: oidText, TypeModifier: -1},
	}}
	b := newBuilder(keyed)
	b.change(0, Update, 1, []types.Value{b.text("new@x")}, []types.Value{b.text("old@x")},
		[]types.Value{b.text("new@x"), b.text("Ann")})
	o, lines := run(t, b, func(c *Change) error {
		if err := c.MapStr("name", func(s string) string { return s }); err != nil {
			return err
		}
		return c.MapStr("email", strings.ToUpper)
	})
	want(t, lines, "public.people update key=[text:NEW@X] old=[text:OLD@X] row=[text:NEW@X text:Ann]")
	if string(o.Data) != "NEW@XNEW@XOLD@X" {
		t.Errorf("data %q: an unchanged text must keep its span", o.Data)
	}
}

func TestDropKeepAndRefuse(t *testing.T) {
	b := newBuilder(users)
	b.user(Insert, 1, "a@x")
	b.user(Insert, 2, "b@x")
	b.user(Insert, 3, "c@x")
	o, lines := run(t, b, func(c *Change) error {
		id, _ := c.GetInt("id")
		c.EmitCopy("public", "copies")
		switch id {
		case 1:
			c.Drop()
		case 2:
			c.Drop()
			c.Keep()
		case 3:
			return errors.New("no threes")
		}
		return nil
	})
	want(t, lines,
		"public.copies insert key=[int4:1] row=[int4:1 text:a@x int8:7 json:[1] bytes:\\x01]",
		"public.users insert key=[int4:2] row=[int4:2 text:b@x int8:7 json:[1] bytes:\\x01]",
		"public.copies insert key=[int4:2] row=[int4:2 text:b@x int8:7 json:[1] bytes:\\x01]",
	)
	if len(o.Errors) != 1 || o.Errors[0] != (types.ChangeError{Index: 2, Message: "no threes"}) {
		t.Errorf("errors %+v", o.Errors)
	}
	if len(o.Tables) != 2 {
		t.Errorf("the copies' table is listed %d times", len(o.Tables)-1)
	}
}

func TestFailBatch(t *testing.T) {
	b := newBuilder(users)
	b.user(Insert, 1, "a@x")
	_, err := Run(fn(func(c *Change) error {
		return FailBatch(fmt.Errorf("bad setup: %w", errors.New("x")))
	}), b.b)
	if err == nil || err.Error() != "bad setup: x" {
		t.Fatalf("err %v", err)
	}
	b.b.Changes[0].Values.Len = 99
	if _, err := Run(fn(func(*Change) error { return nil }), b.b); err == nil ||
		!strings.Contains(err.Error(), "runs past") {
		t.Fatalf("a span past the values: %v", err)
	}
}

func TestRenamesAndDropColumnBuildEachShapeOnce(t *testing.T) {
	b := newBuilder(users)
	b.user(Insert, 1, "a@x")
	b.user(Update, 2, "b@x")
	b.user(Delete, 3, "")
	o, lines := run(t, b, func(c *Change) error {
		c.RenameTable("archive", "people")
		if err := c.RenameColumn("email", "mail"); err != nil {
			return err
		}
		if err := c.DropColumn("blob"); err != nil {
			return err
		}
		return c.DropColumn("id") // a key column: refused
	})
	if len(lines) != 0 || len(o.Errors) != 3 || o.Errors[0].Message != "cannot drop key column id of archive.people" {
		t.Fatalf("lines %v errors %+v", lines, o.Errors)
	}
	o, lines = run(t, b, func(c *Change) error {
		c.RenameTable("archive", "people")
		if err := c.RenameColumn(1, "mail"); err != nil {
			return err
		}
		return c.DropColumn("blob")
	})
	want(t, lines,
		"archive.people insert key=[int4:1] row=[int4:1 text:a@x int8:7 json:[1]]",
		"archive.people update key=[int4:2] row=[int4:2 text:b@x int8:7 json:[1]]",
		"archive.people delete key=[int4:3] row=[]",
	)
	// The input's, the renamed, the renamed column's and the dropped column's shapes.
	if len(o.Tables) != 4 {
		t.Fatalf("%d tables", len(o.Tables))
	}
	last := o.Tables[o.Changes[0].Table]
	if last.Columns[1].Name != "mail" || len(last.Columns) != 4 || users.Columns[1].Name != "email" {
		t.Fatalf("shape %+v (input %+v)", last, users)
	}
}

func TestEmitCopyKeepsItsValuesAsTheyWere(t *testing.T) {
	b := newBuilder(users)
	b.user(Insert, 1, "a@x")
	_, lines := run(t, b, func(c *Change) error {
		c.EmitCopy("public", "before")
		return c.SetStr("email", "changed")
	})
	want(t, lines,
		"public.users insert key=[int4:1] row=[int4:1 text:changed int8:7 json:[1] bytes:\\x01]",
		"public.before insert key=[int4:1] row=[int4:1 text:a@x int8:7 json:[1] bytes:\\x01]",
	)
}

func TestEmit(t *testing.T) {
	audit := types.Table{Schema: "public", Name: "audit", Columns: []types.Column{
		{Name: "op", TypeOid: oidText, TypeModifier: -1},
		{Name: "lsn", TypeOid: oidText, TypeModifier: -1, IsKey: true},
		{Name: "n", TypeOid: oidInt2, TypeModifier: -1, IsKey: true},
		{Name: "email", TypeOid: oidText, TypeModifier: -1},
		{Name: "id", TypeOid: oidInt8, TypeModifier: -1, IsKey: true},
	}}
	b := newBuilder(users)
	b.user(Insert, 1, "a@x")
	b.user(Delete, 2, "")
	var emitErr error
	o, lines := run(t, b, func(c *Change) error {
		email, ok := c.Get("email")
		if !ok {
			email = Null
		}
		id, _ := c.Get("id")
		row := []any{c.Op().String(), c.LSN(), c.Position().Ordinal, email, id}
		emitErr = c.Emit(Insert, audit, row[:2]...)
		return c.Emit(c.Op(), audit, row...)
	})
	want(t, lines,
		"public.users insert key=[int4:1] row=[int4:1 text:a@x int8:7 json:[1] bytes:\\x01]",
		"public.audit insert key=[text:0/7000028 int2:1 int8:1] row=[text:insert text:0/7000028 int2:1 text:a@x int8:1]",
		"public.users delete key=[int4:2] row=[]",
		"public.audit delete key=[text:0/7000028 int2:2 int8:2] row=[]",
	)
	if emitErr == nil || emitErr.Error() != "emit into public.audit: 2 values for 5 columns" {
		t.Errorf("emit: %v", emitErr)
	}
	if len(o.Tables) != 2 {
		t.Errorf("%d tables", len(o.Tables))
	}
	// The email read from the batch kept its span: only the ops and LSNs are new, and the
	// LSN the second change repeats is written once.
	if string(o.Data) != "insert0/7000028delete" {
		t.Errorf("data %q", o.Data)
	}
}

func TestEmitSharesAKeyThatLeadsTheRow(t *testing.T) {
	audit := types.Table{Schema: "public", Name: "audit", Columns: []types.Column{
		{Name: "lsn", TypeOid: oidText, TypeModifier: -1, IsKey: true},
		{Name: "n", TypeOid: oidInt8, TypeModifier: -1, IsKey: true},
		{Name: "op", TypeOid: oidText, TypeModifier: -1},
	}}
	b := newBuilder(users)
	b.user(Insert, 1, "a@x")
	o, _ := run(t, b, func(c *Change) error {
		return c.Emit(Insert, audit, "l", 1, Text("insert"))
	})
	e := o.Changes[1]
	if e.Key != (types.Span{Start: e.Values.Start, Len: 2}) || len(o.Values) != len(b.b.Values)+3 {
		t.Errorf("key %+v row %+v, %d values", e.Key, e.Values, len(o.Values))
	}
}

func TestFilter(t *testing.T) {
	b := newBuilder(users)
	b.user(Insert, 1, "keep")
	b.user(Insert, 2, "test")
	b.user(Update, 3, "test", 30)
	b.user(Update, 4, "test")
	b.user(Update, 5, "keep")
	b.user(Delete, 6, "")
	b.user(Truncate, 0, "")
	_, lines := run(t, b, func(c *Change) error {
		c.Filter(func(row *Change) bool { s, _ := row.GetStr("email"); return s != "test" })
		return nil
	})
	want(t, lines,
		"public.users insert key=[int4:1] row=[int4:1 text:keep int8:7 json:[1] bytes:\\x01]",
		"public.users delete key=[int4:30] row=[]",
		"public.users delete key=[int4:4] row=[]",
		"public.users update key=[int4:5] row=[int4:5 text:keep int8:7 json:[1] bytes:\\x01]",
		"public.users delete key=[int4:6] row=[]",
		"public.users truncate key=[] row=[]",
	)
}

func TestValueWidthsAndKinds(t *testing.T) {
	typed := types.Table{Schema: "s", Name: "t", Columns: []types.Column{
		{Name: "i2", TypeOid: oidInt2}, {Name: "f4", TypeOid: oidFloat4},
		{Name: "num", TypeOid: oidNumeric}, {Name: "u", TypeOid: oidUUID},
		{Name: "ts", TypeOid: oidTimestampTZ}, {Name: "x", TypeOid: 600},
		{Name: "j", TypeOid: oidJSON}, {Name: "k", TypeOid: oidInt8, IsKey: true},
	}}
	b := newBuilder(users)
	b.user(Insert, 1, "a@x")
	_, lines := run(t, b, func(c *Change) error {
		c.Drop()
		return c.Emit(Insert, typed, int16(3), float32(1.5), 2.25,
			"00000000-0000-0000-0000-00000000000a", Int(5), "(1,2)", "{}", uint64(9))
	})
	want(t, lines, "s.t insert key=[int8:9] row=[int2:3 float4:1.5 numeric:2.25 "+
		"uuid:00000000-0000-0000-0000-00000000000a timestamptz:5 other:(1,2) json:{} int8:9]")
	b = newBuilder(typed)
	nulls := make([]types.Value, 8)
	for i := range nulls {
		nulls[i] = types.MakeValueNull()
	}
	b.change(0, Insert, 1, []types.Value{types.MakeValueInt8(1)}, nil, nulls)
	o, _ := Run(fn(func(c *Change) error {
		return c.Emit(Insert, typed, 1<<20, nil, nil, nil, nil, nil, nil, nil)
	}), b.b)
	if o.Errors[0].Message != "1048576 does not fit column i2" {
		t.Errorf("errors %+v", o.Errors)
	}
	o, _ = Run(fn(func(c *Change) error { return c.SetStr("u", "nope") }), b.b)
	if o.Errors[0].Message != "column u: `nope` is not a UUID" {
		t.Errorf("errors %+v", o.Errors)
	}
}

func TestStaleValuesAreWrittenAfresh(t *testing.T) {
	b := newBuilder(users)
	b.user(Insert, 1, "a@x")
	var kept Value
	Run(fn(func(c *Change) error { kept, _ = c.Get("email"); return nil }), b.b)
	o, lines := run(t, b, func(c *Change) error { return c.Set("email", kept) })
	if string(o.Data) != "a@x" || !strings.Contains(lines[0], "text:a@x") {
		t.Errorf("a value of an earlier batch must be written anew: data %q", o.Data)
	}
}

func TestConfig(t *testing.T) {
	c := NewConfig([][2]string{{"n", " 12 "}, {"list", "a, b,,c "}, {"flag", "yes"}})
	if v := c.Get("n", "x"); v != " 12 " {
		t.Error(v)
	}
	if v := c.Get("none", "x"); v != "x" {
		t.Error(v)
	}
	if v := c.List("list"); !reflect.DeepEqual(v, []string{"a", "b", "c"}) {
		t.Error(v)
	}
	if v := c.List("none"); len(v) != 0 {
		t.Error(v)
	}
	if n, err := Parse(c, "n", 3); n != 12 || err != nil {
		t.Error(n, err)
	}
	if n, err := Parse(c, "none", 3); n != 3 || err != nil {
		t.Error(n, err)
	}
	if _, err := Parse(c, "flag", false); err == nil || err.Error() != "config `flag`: cannot read `yes`: invalid syntax" {
		t.Error(err)
	}
	if _, err := Require[string](c, "none"); err == nil || err.Error() != "config `none` is required" {
		t.Error(err)
	}
	if err := c.AllowOnly("n", "list"); err == nil || err.Error() != "unknown config key `flag`; expected n, list" {
		t.Error(err)
	}
	if err := NewConfig(nil).AllowOnly(); err != nil {
		t.Error(err)
	}
	if err := c.AllowOnly(); err == nil || err.Error() != "unknown config key `n`; expected none" {
		t.Error(err)
	}
}

func TestExports(t *testing.T) {
	var logged []string
	logSink = func(l Level, m string) { logged = append(logged, fmt.Sprint(l, " ", m)) }
	current, factory = nil, nil
	b := newBuilder(users)
	b.user(Insert, 1, "a@x")
	if r := exports.Transform(b.b); !r.IsErr() || r.Err() != "transform called before init" {
		t.Fatalf("%+v", r)
	}
	Export(func(cfg *Config) (Transform, error) {
		if err := cfg.AllowOnly("drop"); err != nil {
			return nil, err
		}
		Logf(LevelInfo, "dropping %v", cfg.List("drop"))
		return fn(func(c *Change) error {
			if c.Op() == Insert {
				panic("boom")
			}
			return nil
		}), nil
	})
	bad := []witTypes.Tuple2[string, string]{{F0: "drip", F1: "x"}}
	if r := exports.Init(bad); !r.IsErr() || r.Err() != "unknown config key `drip`; expected drop" {
		t.Fatalf("%+v", r)
	}
	if r := exports.Init([]witTypes.Tuple2[string, string]{{F0: "drop", F1: "a,b"}}); r.IsErr() {
		t.Fatal(r.Err())
	}
	if r := exports.Transform(b.b); !r.IsErr() || r.Err() != "panic: boom" {
		t.Fatalf("%+v", r)
	}
	b = newBuilder(users)
	b.user(Delete, 1, "")
	if r := exports.Transform(b.b); r.IsErr() || len(r.Ok().Changes) != 1 {
		t.Fatalf("%+v", r)
	}
	if !reflect.DeepEqual(logged, []string{"2 dropping [a b]"}) {
		t.Errorf("logged %q", logged)
	}
}

func TestColumnsAndPlainValues(t *testing.T) {
	b := newBuilder(users)
	b.user(Update, 1, "a@x")
	var got []string
	_, lines := run(t, b, func(c *Change) error {
		col, ok := c.Column("score")
		_, none := c.Column("nowhere")
		got = append(got, fmt.Sprint(c.KeyColumns(), col.TypeOid, ok, none, c.HasColumn(4), c.Columns()))
		if err := c.Set("nowhere", 1); err == nil {
			return errors.New("no error for a missing column")
		}
		if err := c.Set("score", struct{}{}); err == nil || err.Error() != "column score: cannot write a struct {}" {
			return fmt.Errorf("struct: %v", err)
		}
		if err := c.Set("score", uint64(1<<63)); err == nil {
			return errors.New("no error for a uint64 past int64")
		}
		if err := c.Set("email", nil); err != nil {
			return err
		}
		return c.Set("score", uint8(9))
	})
	want(t, got, "[id] 20 true false true [id email score tags blob]")
	want(t, lines, "public.users update key=[int4:1] row=[int4:1 null:NULL int8:9 json:[1] bytes:\\x01]")
	if v := Unchanged.IfUnchanged(Null); !v.IsNull() {
		t.Error(v)
	}
	if v := Text("x").IfUnchanged(Null); v.String() != "x" {
		t.Error(v)
	}
}

func TestExportKeysAndFailBatchf(t *testing.T) {
	logSink = func(Level, string) {}
	Export(func(cfg *Config) (Transform, error) {
		return Func(func(c *Change) error { return FailBatchf("no %s", cfg.Get("what", "?")) }), nil
	}, "what")
	if r := exports.Init([]witTypes.Tuple2[string, string]{{F0: "whot", F1: "x"}}); !r.IsErr() ||
		r.Err() != "unknown config key `whot`; expected what" {
		t.Fatalf("%+v", r)
	}
	if r := exports.Init([]witTypes.Tuple2[string, string]{{F0: "what", F1: "way"}}); r.IsErr() {
		t.Fatal(r.Err())
	}
	b := newBuilder(users)
	b.user(Insert, 1, "a@x")
	if r := exports.Transform(b.b); !r.IsErr() || r.Err() != "no way" {
		t.Fatalf("%+v", r)
	}
}

func TestAReadTextTakesItsNewColumnsKindWithoutCopying(t *testing.T) {
	b := newBuilder(users)
	b.user(Insert, 1, "[3]")
	o, lines := run(t, b, func(c *Change) error {
		email, _ := c.Get("email")
		return c.Set("tags", email) // a json column: the text becomes json, its span kept
	})
	want(t, lines, "public.users insert key=[int4:1] row=[int4:1 text:[3] int8:7 json:[3] bytes:\\x01]")
	if len(o.Data) != 0 {
		t.Errorf("data %q", o.Data)
	}
}

func TestEmitKeepsTheTableAsItWasAndLeavesNothingOnError(t *testing.T) {
	audit := types.Table{Schema: "s", Name: "a", Columns: []types.Column{
		{Name: "k", TypeOid: oidInt4, TypeModifier: -1, IsKey: true},
		{Name: "n", TypeOid: oidInt2, TypeModifier: -1},
	}}
	b := newBuilder(users)
	b.user(Insert, 1, "a@x")
	b.user(Insert, 2, "b@x")
	b.user(Insert, 3, "c@x")
	o, lines := run(t, b, func(c *Change) error {
		id, _ := c.GetInt("id")
		if id == 2 {
			// The second value does not fit: nothing of the row stays behind.
			return c.Emit(Insert, audit, 7, 1<<20)
		}
		err := c.Emit(Insert, audit, id, id*10)
		audit.Columns[1].Name = "renamed" // after the emit: its table keeps its shape
		return err
	})
	want(t, lines,
		"public.users insert key=[int4:1] row=[int4:1 text:a@x int8:7 json:[1] bytes:\\x01]",
		"s.a insert key=[int4:1] row=[int4:1 int2:10]",
		"public.users insert key=[int4:3] row=[int4:3 text:c@x int8:7 json:[1] bytes:\\x01]",
		"s.a insert key=[int4:3] row=[int4:3 int2:30]",
	)
	if len(o.Values) != len(b.b.Values)+4 || len(o.Errors) != 1 || o.Errors[0].Index != 1 {
		t.Errorf("%d values (input %d), errors %+v", len(o.Values), len(b.b.Values), o.Errors)
	}
	if len(o.Tables) != 3 || o.Tables[1].Columns[1].Name != "n" || o.Tables[2].Columns[1].Name != "renamed" {
		t.Errorf("tables %+v", o.Tables)
	}
}

func TestEmitManyAndNoneInOneBatch(t *testing.T) {
	b := newBuilder(users)
	for i := int32(1); i <= 300; i++ {
		b.user(Insert, i, fmt.Sprint("u", i))
	}
	b.user(Truncate, 0, "")
	var wantLines []string
	o, lines := run(t, b, func(c *Change) error {
		id, _ := c.Get("id")
		n, _ := id.Int()
		if c.Op() == Truncate {
			wantLines = append(wantLines, "public.users truncate key=[] row=[]", "public.t truncate key=[] row=[]")
			return c.Emit(Truncate, Table{Schema: "public", Name: "t", Columns: c.Shape().Columns}, Null, Null, Null, Null, Null)
		}
		email, _ := c.Get("email")
		if n%5 == 0 {
			c.Drop()
		} else {
			wantLines = append(wantLines, show(b.b, types.Output{Tables: []types.Table{users}, Values: b.b.Values}, b.b.Changes[n-1]))
		}
		for k := int64(0); k < n%3; k++ {
			t := Table{Schema: "public", Name: "t", Columns: c.Shape().Columns}
			wantLines = append(wantLines, fmt.Sprintf("public.t delete key=[int4:%d] row=[]", n),
				fmt.Sprintf("public.t insert key=[int4:%d] row=[int4:%d text:u%d int8:%d json:[1] null:NULL]", n, n, n, k))
			if err := c.Emit(Delete, t, id, nil, nil, nil, nil); err != nil {
				return err
			}
			if err := c.Emit(Insert, t, id, email, k, JSON("[1]"), nil); err != nil {
				return err
			}
		}
		return nil
	})
	want(t, lines, wantLines...)
	if len(o.Tables) != 2 || len(o.Errors) != 0 {
		t.Errorf("%d tables, errors %+v", len(o.Tables), o.Errors)
	}
	// A truncate's key and row are empty: nothing was added for it.
	last := o.Changes[len(o.Changes)-1]
	if last.Key.Len != 0 || last.Values.Len != 0 || int(last.Key.Start) != len(o.Values) {
		t.Errorf("truncate %+v, %d values", last, len(o.Values))
	}
}

func TestOneWideEmitGrowsTheListsBoundedly(t *testing.T) {
	wide := types.Table{Schema: "s", Name: "wide"}
	for i := range 40 {
		wide.Columns = append(wide.Columns, types.Column{Name: fmt.Sprint("c", i), TypeOid: oidInt8, IsKey: i == 0})
	}
	b := newBuilder(users)
	for i := int32(1); i <= 1000; i++ {
		b.user(Insert, i, "x")
	}
	o, err := Run(fn(func(c *Change) error {
		if c.Position().Ordinal != 1 {
			return nil
		}
		return c.Emit(Insert, wide, make([]any, 40)...)
	}), b.b)
	if err != nil || len(o.Changes) != 1001 || len(o.Values) != len(b.b.Values)+40 {
		t.Fatalf("%v: %d changes, %d values", err, len(o.Changes), len(o.Values))
	}
	// Room for a wide row from every change would be 40,000 values: at most doubled instead.
	if cap(o.Values) > 2*len(b.b.Values) || cap(o.Changes) > 2*len(b.b.Changes) {
		t.Errorf("capacity %d values, %d changes", cap(o.Values), cap(o.Changes))
	}
}

func TestReadValuesAreWrittenBackAsTheyWere(t *testing.T) {
	typed := types.Table{Schema: "s", Name: "t", Columns: []types.Column{
		{Name: "f4", TypeOid: oidFloat4}, {Name: "u", TypeOid: oidUUID}, {Name: "ts", TypeOid: oidTimestampTZ},
		{Name: "i4", TypeOid: oidInt4, IsKey: true}, {Name: "txt", TypeOid: oidText}, {Name: "j", TypeOid: oidJSON},
		{Name: "bin", TypeOid: oidBytea}, {Name: "num", TypeOid: oidNumeric},
	}}
	b := newBuilder(typed)
	row := []types.Value{types.MakeValueFloat4(1.5), types.MakeValueUuid(witTypes.Tuple2[uint64, uint64]{F0: 1, F1: 2}),
		types.MakeValueTimestamptz(5), types.MakeValueInt4(300), b.text("[2]"), b.json("{}"), b.bytes("\x00"),
		types.MakeValueNumeric(b.span("1.50"))}
	b.change(0, Insert, 1, row[3:4], nil, row)
	wide := typed
	wide.Name, wide.Columns = "wide", slices.Clone(typed.Columns)
	wide.Columns[3].TypeOid, wide.Columns[4].TypeOid = oidInt8, oidJSON
	o, lines := run(t, b, func(c *Change) error {
		var vals []any
		for i := range 8 {
			v, _ := c.Get(i)
			vals = append(vals, v)
		}
		if err := c.Emit(Insert, c.Shape(), vals...); err != nil {
			return err
		}
		return c.Emit(Insert, wide, vals...)
	})
	want(t, lines,
		"s.t insert key=[int4:300] row=[float4:1.5 uuid:00000000-0000-0001-0000-000000000002 timestamptz:5 int4:300 text:[2] json:{} bytes:\\x00 numeric:1.50]",
		"s.t insert key=[int4:300] row=[float4:1.5 uuid:00000000-0000-0001-0000-000000000002 timestamptz:5 int4:300 text:[2] json:{} bytes:\\x00 numeric:1.50]",
		"s.wide insert key=[int8:300] row=[float4:1.5 uuid:00000000-0000-0001-0000-000000000002 timestamptz:5 int8:300 json:[2] json:{} bytes:\\x00 numeric:1.50]",
	)
	if !reflect.DeepEqual(o.Values[len(b.b.Values):len(b.b.Values)+8], row) {
		t.Errorf("a value read and written back into the same shape is not the one read")
	}
	if len(o.Data) != 0 {
		t.Errorf("data %q: nothing new was written", o.Data)
	}
}

func TestValueRoundTrips(t *testing.T) {
	if b, ok := Bytes([]byte("ab")).Bytes(); !ok || string(b) != "ab" {
		t.Error(b, ok)
	}
	if f, ok := Float(-2.5).Float(); !ok || f != -2.5 {
		t.Error(f, ok)
	}
	if hi, lo, ok := UUID(3, 4).UUID(); !ok || hi != 3 || lo != 4 {
		t.Error(hi, lo, ok)
	}
	if n, ok := Date(-7).Temporal(); !ok || n != -7 {
		t.Error(n, ok)
	}
	if oid, ok := Other(600, "(1,2)").OID(); !ok || oid != 600 || Other(600, "(1,2)").String() != "(1,2)" {
		t.Error(oid, ok)
	}
	var zero Value
	if !zero.IsNull() || zero.Kind() != KindNull || !Null.IsNull() || !Unchanged.IsUnchanged() ||
		zero.String() != "NULL" || Bool(true).String() != "true" || Float(0.5).String() != "0.5" {
		t.Error("zero, Null, Unchanged or String")
	}
	if _, ok := Text("x").Bytes(); ok {
		t.Error("a text is not bytes")
	}
}

// orders is an 8-column table like the ones go-split's benchmark splits.
var orders = types.Table{Schema: "public", Name: "orders", Columns: []types.Column{
	{Name: "id", TypeOid: oidInt8, TypeModifier: -1, IsKey: true},
	{Name: "customer_id", TypeOid: oidInt4, TypeModifier: -1},
	{Name: "status", TypeOid: oidText, TypeModifier: -1},
	{Name: "total", TypeOid: oidNumeric, TypeModifier: -1},
	{Name: "note", TypeOid: oidText, TypeModifier: -1},
	{Name: "placed_at", TypeOid: oidTimestampTZ, TypeModifier: -1},
	{Name: "tags", TypeOid: oidJSONB, TypeModifier: -1},
	{Name: "rush", TypeOid: oidBool, TypeModifier: -1},
}}

// ordersBatch lays out n changes of orders (inserts, and updates whose note is unchanged),
// a few transactions of 100 changes each.
func ordersBatch(n int) types.Batch {
	b := newBuilder(orders)
	for i := 0; i < n; i++ {
		op, note := Insert, b.text("leave at the door")
		if i%2 == 1 {
			op, note = Update, types.MakeValueUnchanged()
		}
		id := types.MakeValueInt8(int64(1000 + i))
		row := []types.Value{id, types.MakeValueInt4(int32(i % 50)), b.text("shipped"),
			types.MakeValueNumeric(b.span("49.95")), note, types.MakeValueTimestamptz(770000000000000),
			b.json(`["gift"]`), types.MakeValueBoolean(i%3 == 0)}
		b.change(0, op, uint32(i%100+1), []types.Value{id}, nil, row)
		b.b.Changes[i].Position.LsnLow = 0x7000028 + uint64(i/100)*0x100
	}
	return b.b
}

// split is go-split's transform (guest-examples/go-split/main.go) with its sample's config.
func split(table, audit string, columns []string) Func {
	return Func(func(c *Change) error {
		if !c.IsTable(table) {
			return nil
		}
		t := Table{Schema: c.Schema(), Name: audit, Columns: []Column{
			{Name: "change_lsn", TypeOid: 25, TypeModifier: -1, IsKey: true},
			{Name: "change_ordinal", TypeOid: 20, TypeModifier: -1, IsKey: true},
			{Name: "op", TypeOid: 25, TypeModifier: -1}}}
		row, keys := []any{c.LSN(), c.Position().Ordinal, c.Op().String()}, c.KeyColumns()
		for i, name := range append(keys, columns...) {
			v, _ := c.Get(name)
			if col, ok := c.Column(name); !ok {
				return FailBatchf("%s.%s has no column `%s` to copy into %s", c.Schema(), c.Table(), name, audit)
			} else if !col.IsKey || i < len(keys) {
				col.IsKey, v = false, v.IfUnchanged(Null)
				t.Columns, row = append(t.Columns, col), append(row, v)
			}
		}
		return c.Emit(Insert, t, row...)
	})
}

func TestSplit(t *testing.T) {
	batch := ordersBatch(4)
	o, err := Run(split("public.orders", "order_audit", []string{"status", "total", "note"}), batch)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, c := range o.Changes {
		lines = append(lines, show(batch, o, c))
	}
	row := func(id int, op, status, note string) string {
		return fmt.Sprintf("public.order_audit insert key=[text:0/7000028 int8:%d] row=[text:0/7000028 "+
			"int8:%d text:%s int8:%d text:%s numeric:49.95 %s]", id-999, id-999, op, id, status, note)
	}
	want(t, lines,
		"public.orders insert key=[int8:1000] row=[int8:1000 int4:0 text:shipped numeric:49.95 "+
			"text:leave at the door timestamptz:770000000000000 json:[\"gift\"] boolean:true]",
		row(1000, "insert", "shipped", "text:leave at the door"),
		"public.orders update key=[int8:1001] row=[int8:1001 int4:1 text:shipped numeric:49.95 "+
			"unchanged:UNCHANGED timestamptz:770000000000000 json:[\"gift\"] boolean:false]",
		row(1001, "update", "shipped", "null:NULL"),
		"public.orders insert key=[int8:1002] row=[int8:1002 int4:2 text:shipped numeric:49.95 "+
			"text:leave at the door timestamptz:770000000000000 json:[\"gift\"] boolean:false]",
		row(1002, "insert", "shipped", "text:leave at the door"),
		"public.orders update key=[int8:1003] row=[int8:1003 int4:3 text:shipped numeric:49.95 "+
			"unchanged:UNCHANGED timestamptz:770000000000000 json:[\"gift\"] boolean:true]",
		row(1003, "update", "shipped", "null:NULL"),
	)
	if len(o.Tables) != 2 || len(o.Errors) != 0 {
		t.Errorf("%d tables, errors %+v", len(o.Tables), o.Errors)
	}
}

// runBatches runs f over batch as the transform export does (which, in a component,
// collects garbage first: see init), once per op, reporting allocations.
func runBatches(b *testing.B, f Func, batch types.Batch) {
	current = f
	defer func() { current = nil }()
	b.ReportAllocs()
	for b.Loop() {
		if r := transformExport(batch); r.IsErr() {
			b.Fatal(r.Err())
		}
	}
}

// BenchmarkEmit runs go-split's transform over a batch of 1,000 changes of 8 columns: an
// op is one batch (divide by 1,000 for a change).
func BenchmarkEmit(b *testing.B) {
	runBatches(b, split("public.orders", "order_audit", []string{"status", "total", "note"}), ordersBatch(1000))
}

// BenchmarkPassThrough runs a transform that reads one value of each change and changes
// nothing, over the same batch.
func BenchmarkPassThrough(b *testing.B) {
	runBatches(b, func(c *Change) error { c.GetStr("status"); return nil }, ordersBatch(1000))
}
