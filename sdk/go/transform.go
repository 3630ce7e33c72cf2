// Package transform writes Zipline transforms in Go without touching the batch layout.
//
// A transform is a value with a Change method (or a Func), registered with Export from an
// init function of the guest's main package:
//
//	package main
//
//	import "zipline/transform"
//
//	// Keeps only rows whose status is not 'test', correctly across updates.
//	func init() {
//		transform.Export(func(cfg *transform.Config) (transform.Transform, error) {
//			return transform.Func(func(c *transform.Change) error {
//				c.Filter(func(row *transform.Change) bool { s, _ := row.GetStr("status"); return s != "test" })
//				return nil
//			}), cfg.AllowOnly()
//		})
//	}
//
//	func main() {}
//
// Zipline calls the factory once per instance with the route's `config:` map (an error stops
// the pipeline at startup), then Change for every change of every batch, in commit order.
// Through Change a transform reads values by column name or index, sets new ones (the
// change's key follows a key column by itself), drops the change or a column, renames its
// table or columns, emits extra changes, or keeps a row filter correct across updates.
// Returning an error from Change refuses that change alone (the route's `on_error` decides);
// FailBatch(err), or a panic, fails the whole batch.
//
// Under the hood a batch is the flat lists of wit/transform.wit: a change's values are a span
// of the batch's values, and a text is a span of its data. Reading is slicing; a change
// nobody touched goes out exactly as it came (nothing decoded or copied); a new text is
// appended once to the output's data.
package transform

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"

	exports "zipline/transform/wit/export_wit_world"
	host "zipline/transform/wit/zipline_transform_host"
	types "zipline/transform/wit/zipline_transform_types"

	// The generated `//go:wasmexport` functions: importing the SDK links them in.
	_ "zipline/transform/wit/wit_exports"

	witTypes "go.bytecodealliance.org/pkg/wit/types"
)

// Transform is what Export runs: Change transforms one change in place. A non-nil error
// refuses that change (its emitted changes go with it); FailBatch(err) fails the batch.
type Transform interface {
	Change(c *Change) error
}

// Func is a Transform of a function, for a transform whose state its closure holds.
type Func func(c *Change) error

// Change calls f(c).
func (f Func) Change(c *Change) error { return f(c) }

// Table is a table's shape: schema, name and columns. Changes refer to one.
type Table = types.Table

// Column is one column of a Table: Name, TypeOid (PostgreSQL's type OID: 23 int4, 25 text,
// ...), TypeModifier (-1 when none) and IsKey.
type Column = types.Column

// Position is where a change sits in commit order (LsnHigh, LsnLow, Ordinal).
type Position = types.Position

// Op is what a change does to its row.
type Op uint8

// The ops, as the contract numbers them.
const (
	Insert   Op = Op(types.Op_Insert)
	Update   Op = Op(types.Op_Update)
	Delete   Op = Op(types.Op_Delete)
	Truncate Op = Op(types.Op_Truncate)
)

var opNames = [...]string{"insert", "update", "delete", "truncate"}

// String returns "insert", "update", "delete" or "truncate".
func (op Op) String() string {
	if int(op) < len(opNames) {
		return opNames[op]
	}
	return fmt.Sprintf("op(%d)", uint8(op))
}

// Level is a log level; LevelError is for conditions an operator must look at.
type Level uint8

// The log levels.
const (
	LevelTrace = Level(host.Level_Trace)
	LevelDebug = Level(host.Level_Debug)
	LevelInfo  = Level(host.Level_Info)
	LevelWarn  = Level(host.Level_Warn)
	LevelError = Level(host.Level_Error)
)

// logSink is the host's log in a component (log_wasm.go); natively, where the host import
// cannot link, standard error, and tests replace it.
var logSink = func(level Level, message string) {
	fmt.Fprintf(os.Stderr, "%v: %s\n", level, message)
}

// Log writes a line to Zipline's log, tagged with the route and module.
func Log(level Level, message string) { logSink(level, message) }

// Logf is Log with fmt.Sprintf's formatting.
func Logf(level Level, format string, args ...any) { logSink(level, fmt.Sprintf(format, args...)) }

type batchError struct{ err error }

func (e batchError) Error() string { return e.err.Error() }
func (e batchError) Unwrap() error { return e.err }

// FailBatch marks err, returned from Change, as failing the whole batch rather than
// refusing one change: for a fault of the transform's setup, not of the change.
func FailBatch(err error) error {
	if err == nil {
		return nil
	}
	return batchError{err}
}

// FailBatchf is FailBatch(fmt.Errorf(format, args...)).
func FailBatchf(format string, args ...any) error {
	return batchError{fmt.Errorf(format, args...)}
}

// The exports' state: the transform Init built, and the number of the batch being run.
var (
	factory func(*Config) (Transform, error)
	current Transform
	epoch   uint64
)

func init() {
	// The Go GC may otherwise run inside cabi_realloc while the host copies a large batch in,
	// and the runtime's stack switch then traps ("cannot leave component instance"); each
	// transform call collects at its start instead.
	if runtime.GOOS == "wasip1" {
		debug.SetGCPercent(-1)
	}
	exports.Init = initExport
	exports.Transform = transformExport
}

// Export makes newTransform the component's transform: call it from an init function of
// the main package. newTransform gets the route's config once per instance; an error stops
// the pipeline at startup with its message. keys, if any, are the config keys the transform
// takes: any other stops the pipeline before newTransform runs (cfg.AllowOnly). With none,
// Export checks nothing: call cfg.AllowOnly() for a transform that takes no config.
func Export(newTransform func(cfg *Config) (Transform, error), keys ...string) {
	factory = newTransform
	if len(keys) > 0 {
		factory = func(cfg *Config) (Transform, error) {
			if err := cfg.AllowOnly(keys...); err != nil {
				return nil, err
			}
			return newTransform(cfg)
		}
	}
}

func initExport(config []witTypes.Tuple2[string, string]) (result witTypes.Result[witTypes.Unit, string]) {
	current = nil
	defer func() {
		if r := recover(); r != nil {
			result = witTypes.Err[witTypes.Unit](fmt.Sprintf("panic: %v", r))
		}
	}()
	if factory == nil {
		return witTypes.Err[witTypes.Unit]("no transform exported: call transform.Export from an init function")
	}
	pairs := make([][2]string, len(config))
	for i, kv := range config {
		pairs[i] = [2]string{kv.F0, kv.F1}
	}
	t, err := factory(NewConfig(pairs))
	if err != nil {
		return witTypes.Err[witTypes.Unit](err.Error())
	}
	if t == nil {
		return witTypes.Err[witTypes.Unit]("the transform's factory returned no transform")
	}
	current = t
	return witTypes.Ok[witTypes.Unit, string](witTypes.Unit{})
}

func transformExport(batch types.Batch) (result witTypes.Result[types.Output, string]) {
	if current == nil {
		return witTypes.Err[types.Output]("transform called before init")
	}
	if runtime.GOOS == "wasip1" {
		// The previous call's output has been copied out by now, and nothing is being lowered
		// into our memory (see init).
		runtime.GC()
	}
	defer func() {
		if r := recover(); r != nil {
			result = witTypes.Err[types.Output](fmt.Sprintf("panic: %v", r))
		}
	}()
	out, err := Run(current, batch)
	if err != nil {
		return witTypes.Err[types.Output](err.Error())
	}
	return witTypes.Ok[types.Output, string](out)
}

// Run runs t over each change of batch, in commit order, and returns the output; an error
// fails the batch. The exports call it; it is exported for tests of transforms.
func Run(t Transform, batch types.Batch) (types.Output, error) {
	if err := check(batch); err != nil {
		return types.Output{}, err
	}
	epoch++
	o := &out{
		input:   batch.Data,
		base:    uint32(len(batch.Data)),
		values:  batch.Values,
		tables:  batch.Tables,
		changes: make([]types.Change, 0, len(batch.Changes)),
		errors:  []types.ChangeError{},
		epoch:   epoch,
		inputs:  len(batch.Changes),
	}
	// The Changes handed to t, a block at a time rather than one allocation each.
	var block []Change
	for index, raw := range batch.Changes {
		o.index = index
		if len(block) == 0 {
			block = make([]Change, min(len(batch.Changes)-index, 256))
		}
		c := &block[0]
		block = block[1:]
		*c = Change{out: o, raw: raw}
		// Its place, before what it emits (room as for an emit: for itself and one emitted, from
		// this change on).
		o.changes = reserve(o.changes, 1, 2*(len(batch.Changes)-index))
		mark := len(o.changes)
		o.changes = append(o.changes, raw)
		if err := t.Change(c); err != nil {
			var fail batchError
			if errors.As(err, &fail) {
				return types.Output{}, fail.err
			}
			o.changes = o.changes[:mark] // what it emitted goes with it
			o.errors = append(o.errors, types.ChangeError{Index: uint32(index), Message: err.Error()})
			continue
		}
		if c.dropped {
			o.changes = append(o.changes[:mark], o.changes[mark+1:]...)
			continue
		}
		o.changes[mark] = c.raw
	}
	return types.Output{
		Tables:  o.tables,
		Data:    o.data,
		Values:  o.values,
		Changes: o.changes,
		Errors:  o.errors,
	}, nil
}

// check refuses a batch whose changes point outside its lists, so that nothing after needs
// to.
func check(b types.Batch) error {
	n := uint64(len(b.Values))
	for i, c := range b.Changes {
		if int(c.Table) >= len(b.Tables) {
			return fmt.Errorf("change %d refers to table #%d of %d", i, c.Table, len(b.Tables))
		}
		old := c.OldKey.SomeOr(types.Span{})
		for _, s := range [...]types.Span{c.Key, c.Values, old} {
			if uint64(s.Start)+uint64(s.Len) > n {
				return fmt.Errorf("change %d: span %d+%d runs past the %d values", i, s.Start, s.Len, n)
			}
		}
	}
	return nil
}
