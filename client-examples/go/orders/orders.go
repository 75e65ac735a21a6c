// Package orders is the example's domain: the order set of ../orders.json and its rules.
package orders

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
)

// Line is one order line.
type Line struct {
	SKU string `json:"sku"`
	Qty int64  `json:"qty"`
}

// Order is one order, as published in an entry's payload.
type Order struct {
	ID    string `json:"id"`
	Lines []Line `json:"lines"`
	// Flaky orders fail on their first delivery (the worker retries them after a delay).
	Flaky bool `json:"flaky,omitempty"`
}

// Invalid says why an order can never be processed ("" when it is valid).
func (o *Order) Invalid() string {
	if o.ID == "" {
		return "order without an id"
	}
	if len(o.Lines) == 0 {
		return "order has no lines"
	}
	for i, l := range o.Lines {
		if l.SKU == "" {
			return fmt.Sprintf("line %d has no sku", i+1)
		}
		if l.Qty <= 0 {
			return fmt.Sprintf("line %d (%s) has qty %d <= 0", i+1, l.SKU, l.Qty)
		}
	}
	return ""
}

// File is orders.json: the order set and the Redis end state a worker must reach.
type File struct {
	Stream string            `json:"stream"`
	Group  string            `json:"group"`
	Orders []json.RawMessage `json:"orders"`
	// Expected is the end state (checked by run-e2e.sh).
	Expected struct {
		Acked   int `json:"acked"`
		Dropped int `json:"dropped"`
		Retried int `json:"retried"`
	} `json:"expected"`
}

// Load reads orders.json.
func Load(path string) (*File, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f File
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &f, nil
}

// Payloads are the orders as compact JSON, one per entry to publish.
func (f *File) Payloads() ([][]byte, error) {
	out := make([][]byte, 0, len(f.Orders))
	for i, raw := range f.Orders {
		var b bytes.Buffer
		if err := json.Compact(&b, raw); err != nil {
			return nil, fmt.Errorf("order %d: %w", i+1, err)
		}
		out = append(out, b.Bytes())
	}
	return out, nil
}

// Parse decodes a payload.
func Parse(payload []byte) (*Order, error) {
	var o Order
	if err := json.Unmarshal(payload, &o); err != nil {
		return nil, err
	}
	return &o, nil
}
