package replay

import (
	"bytes"
	_ "embed"
	"errors"
	"io"
	"os"

	"github.com/ckfrelay/ckfrelay/internal/sim/workload"
)

//go:embed testdata/mooncake_synthetic.jsonl
var embeddedTrace []byte

// EmbeddedTraceName names the default trace in reports.
const EmbeddedTraceName = "mooncake synthetic (embedded)"

// EmbeddedTrace returns the Mooncake FAST'25 synthetic trace
// (testdata/ATTRIBUTION.md): 3,993 requests over 1,022 s of trace time.
// Each call parses a fresh copy.
func EmbeddedTrace() ([]workload.Request, error) {
	return ReadTrace(bytes.NewReader(embeddedTrace))
}

// LoadTrace reads a Mooncake-format trace file. A malformed line fails with
// the *workload.TraceError naming it (errors.Is matches
// workload.ErrMalformedTrace); a trace without requests fails too.
func LoadTrace(path string) ([]workload.Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadTrace(f)
}

// ErrEmptyTrace: the trace holds no request.
var ErrEmptyTrace = errors.New("replay: trace has no requests")

// ReadTrace reads a whole Mooncake-format trace from r.
func ReadTrace(r io.Reader) ([]workload.Request, error) {
	reqs, err := workload.ReadTrace(r)
	if err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, ErrEmptyTrace
	}
	return reqs, nil
}

// Repeat returns the trace played n times back to back, each pass with fresh
// block ids (shifted past the previous pass's largest id) and timestamps
// shifted past the previous pass's last one, so a pass has the trace's
// sharing structure but shares nothing with other passes. It grows the
// working set to measure scale. n ≤ 1 returns reqs itself.
func Repeat(reqs []workload.Request, n int) []workload.Request {
	if n <= 1 || len(reqs) == 0 {
		return reqs
	}
	var maxID uint64
	for i := range reqs {
		for _, id := range reqs[i].HashIDs {
			maxID = max(maxID, id)
		}
	}
	span := reqs[len(reqs)-1].TimestampMs + 1
	out := make([]workload.Request, 0, len(reqs)*n)
	for p := range n {
		for _, r := range reqs {
			ids := make([]uint64, len(r.HashIDs))
			for i, id := range r.HashIDs {
				ids[i] = id + uint64(p)*(maxID+1)
			}
			r.HashIDs = ids
			r.TimestampMs += int64(p) * span
			out = append(out, r)
		}
	}
	return out
}
