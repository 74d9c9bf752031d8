// Package workload generates and replays KV-cache workloads: Mooncake-format
// request traces, a synthetic multi-turn generator, and a simulated fleet of
// worker ranks with finite LRU caches that turns requests into the
// ckf.RouterEvents a real engine would emit, with the exact ground truth of
// which data center holds which prefix.
//
// It is used by the relay's demo and replay commands and by benchmarks. It is
// not safe for concurrent use.
package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Request is one trace request: its arrival time and the ids of its prompt
// blocks. Equal ids at equal positions mean a shared prefix.
type Request struct {
	TimestampMs  int64    `json:"timestamp"`
	InputLength  int64    `json:"input_length"`
	OutputLength int64    `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// MooncakeBlockTokens is the block size of the Mooncake traces, in tokens.
const MooncakeBlockTokens = 512

// maxTraceLine bounds one trace line (a request with ~100k block ids).
const maxTraceLine = 4 << 20

// ErrMalformedTrace is wrapped by every [*TraceError].
var ErrMalformedTrace = errors.New("workload: malformed trace")

// TraceError reports a malformed trace line.
type TraceError struct {
	Line int   // 1-based line number
	Err  error // what was wrong
}

func (e *TraceError) Error() string {
	return fmt.Sprintf("workload: trace line %d: %v", e.Line, e.Err)
}

// Unwrap lets errors.Is match ErrMalformedTrace and the cause.
func (e *TraceError) Unwrap() []error { return []error{ErrMalformedTrace, e.Err} }

// TraceReader reads a Mooncake-format trace: one JSON object per line with
// timestamp, input_length, output_length and hash_ids. Unknown fields are
// ignored; blank lines are skipped.
type TraceReader struct {
	sc   *bufio.Scanner
	line int
	last int64
}

// NewTraceReader reads requests from r.
func NewTraceReader(r io.Reader) *TraceReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxTraceLine)
	return &TraceReader{sc: sc}
}

// Next returns the next request, io.EOF after the last one, or a
// *TraceError naming the line.
func (t *TraceReader) Next() (Request, error) {
	for t.sc.Scan() {
		t.line++
		b := t.sc.Bytes()
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		var raw struct {
			Timestamp    *int64   `json:"timestamp"`
			InputLength  int64    `json:"input_length"`
			OutputLength int64    `json:"output_length"`
			HashIDs      []uint64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(b, &raw); err != nil {
			return Request{}, &TraceError{Line: t.line, Err: err}
		}
		switch {
		case raw.Timestamp == nil:
			return Request{}, &TraceError{Line: t.line, Err: errors.New("missing timestamp")}
		case *raw.Timestamp < 0:
			return Request{}, &TraceError{Line: t.line, Err: fmt.Errorf("negative timestamp %d", *raw.Timestamp)}
		case *raw.Timestamp < t.last:
			return Request{}, &TraceError{Line: t.line, Err: fmt.Errorf("timestamp %d before previous %d", *raw.Timestamp, t.last)}
		case raw.InputLength < 0 || raw.OutputLength < 0:
			return Request{}, &TraceError{Line: t.line, Err: errors.New("negative length")}
		case raw.HashIDs == nil:
			return Request{}, &TraceError{Line: t.line, Err: errors.New("missing hash_ids")}
		}
		t.last = *raw.Timestamp
		return Request{TimestampMs: *raw.Timestamp, InputLength: raw.InputLength, OutputLength: raw.OutputLength, HashIDs: raw.HashIDs}, nil
	}
	if err := t.sc.Err(); err != nil {
		return Request{}, &TraceError{Line: t.line + 1, Err: err}
	}
	return Request{}, io.EOF
}

// ReadTrace reads every request of a trace.
func ReadTrace(r io.Reader) ([]Request, error) {
	tr := NewTraceReader(r)
	var out []Request
	for {
		req, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, req)
	}
}
