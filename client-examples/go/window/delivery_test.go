package window

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	windowv1 "example.invalid/window-sidecar/client-examples/go/windowv1"
)

// offline is a delivery of a session that records what is queued, without a sidecar.
func offline(d *Delivery) *Delivery {
	d.sess = &session{sub: &Subscription{}}
	d.read = &readState{unsettled: 1}
	return d
}

func queued(d *Delivery) [][]string {
	var out [][]string
	for _, c := range d.commands {
		line := []string{c.GetName()}
		for _, a := range c.GetArgs() {
			line = append(line, string(a))
		}
		out = append(out, line)
	}
	return out
}

// The typed methods queue the command Redis's specification describes, arguments in its order,
// optional ones only when set.
func TestTypedCommands(t *testing.T) {
	d := offline(&Delivery{Slot: 3})
	r := d.Redis()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(r.HINCRBY("totals", "apple", 2))
	must(r.SETWith("k", []byte("v"), SETOptions{Condition: SETConditionNX, Expiration: SETExpirationEX(60)}))
	must(r.XADDWith("s", "*", XADDOptions{Trim: &XADDTrim{Strategy: XADDTrimStrategyMAXLEN, Operator: XADDTrimOperatorApproximately, Threshold: 1000}},
		XADDFieldValue{Field: "sku", Value: "apple"}, XADDFieldValue{Field: "qty", Value: 2}))
	must(r.ZUNIONSTOREWith("dst", ZUNIONSTOREOptions{Weight: []int64{1, 2}, Aggregate: ZUNIONSTOREAggregateMAX}, "a", "b"))
	must(r.DEL("a", "b"))
	must(r.EXPIREWith("k", 10, EXPIREOptions{Condition: EXPIREConditionNX}))
	must(r.LPOPWith("l", LPOPOptions{Count: Int64(2)}))
	must(r.LPOP("l"))
	want := [][]string{
		{"HINCRBY", "totals", "apple", "2"},
		{"SET", "k", "v", "NX", "EX", "60"},
		{"XADD", "s", "MAXLEN", "~", "1000", "*", "sku", "apple", "qty", "2"},
		{"ZUNIONSTORE", "dst", "2", "a", "b", "WEIGHTS", "1", "2", "AGGREGATE", "MAX"},
		{"DEL", "a", "b"},
		{"EXPIRE", "k", "10", "NX"},
		{"LPOP", "l", "2"},
		{"LPOP", "l"},
	}
	if got := queued(d); !reflect.DeepEqual(got, want) {
		t.Fatalf("queued:\n%q\nwant\n%q", got, want)
	}
	for _, c := range d.commands {
		if c.GetSlot() != 3 {
			t.Fatalf("slot %d", c.GetSlot())
		}
	}
	if RedisSpecVersion == "" || len(CommandNames) < 50 {
		t.Fatalf("spec %q, %d commands", RedisSpecVersion, len(CommandNames))
	}
	// A misspelled name is no method: the compiler says so; looked up at run time, nothing.
	if _, ok := reflect.TypeOf(r).MethodByName("HINCRBYY"); ok {
		t.Fatal("HINCRBYY exists")
	}
}

// After the outcome a typed command fails like Queue, with an *AlreadySettledError.
func TestTypedCommandAfterTheOutcome(t *testing.T) {
	d := offline(&Delivery{Slot: 1, EntryID: "1-0"})
	d.outcome = &windowv1.Outcome{Kind: windowv1.OutcomeKind_OUTCOME_KIND_ACK}
	err := d.Redis().INCR("k")
	var ae *AlreadySettledError
	if !errors.As(err, &ae) || !errors.Is(err, ErrAlreadySettled) || ae.Outcome != windowv1.OutcomeKind_OUTCOME_KIND_ACK {
		t.Fatalf("err: %v", err)
	}
	if !strings.Contains(err.Error(), "1-0") {
		t.Fatalf("message: %v", err)
	}
}

// An entry in the payload layout: Text and JSON read the payload. One another producer wrote
// with plain fields: Fields and TextFields have them, JSON and Text say to read them instead.
func TestPayloadAndFields(t *testing.T) {
	d := &Delivery{EntryID: "1-0", Payload: []byte(`{"sku":"apple"}`)}
	var v struct{ SKU string }
	if err := d.JSON(&v); err != nil || v.SKU != "apple" {
		t.Fatalf("JSON: %v %v", v, err)
	}
	if s, err := d.Text(); err != nil || s != `{"sku":"apple"}` || !d.HasPayload() || d.TextFields() != nil {
		t.Fatalf("Text: %q %v", s, err)
	}
	bad := &Delivery{EntryID: "2-0", Payload: []byte("not json")}
	if err := bad.JSON(&v); err == nil || !strings.Contains(err.Error(), "not JSON") {
		t.Fatalf("JSON of text: %v", err)
	}
	raw := []*windowv1.Field{{Name: []byte("sku"), Value: []byte("apple")}, {Name: []byte("qty"), Value: []byte("2")}}
	f := &Delivery{EntryID: "3-0", RawFields: raw, Fields: fieldMap(raw)}
	if f.HasPayload() || string(f.Fields["qty"]) != "2" || !reflect.DeepEqual(f.TextFields(), map[string]string{"sku": "apple", "qty": "2"}) {
		t.Fatalf("fields: %v", f.TextFields())
	}
	err := f.JSON(&v)
	if err == nil || !strings.Contains(err.Error(), "Fields") || !strings.Contains(err.Error(), "sku, qty") {
		t.Fatalf("JSON of fields: %v", err)
	}
	if _, err := f.Text(); err == nil {
		t.Fatal("Text of fields")
	}
}
