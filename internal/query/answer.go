package query

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/consumer"
	"github.com/ckfrelay/ckfrelay/internal/catalog"
)

// request is one stdin line: exactly one of tokens, sequence_hashes and
// local_hashes; lora, namespace and mm_hashes only with tokens.
type request struct {
	Tokens         []uint32        `json:"tokens"`
	SequenceHashes []catalog.U64   `json:"sequence_hashes"`
	LocalHashes    []catalog.U64   `json:"local_hashes"`
	LoRA           string          `json:"lora"`
	Namespace      string          `json:"namespace"`
	MMHashes       [][]catalog.U64 `json:"mm_hashes"`
}

// answer is one stdout line. Depths holds the ready pools; Best is the
// deepest (ties to the first pool given), nil when every depth is 0;
// NotReady lists the pools left out.
type answer struct {
	Depths   map[string]uint32 `json:"depths"`
	Best     *string           `json:"best"`
	NotReady []string          `json:"not_ready,omitempty"`
}

type errorLine struct {
	Error string `json:"error"`
}

// sequence returns the request's canonical sequence hashes.
func (s *poolSet) sequence(line []byte) ([]uint64, error) {
	var q request
	if err := json.Unmarshal(line, &q); err != nil {
		return nil, fmt.Errorf("not a request object: %v", err)
	}
	kinds := 0
	for _, present := range []bool{q.Tokens != nil, q.SequenceHashes != nil, q.LocalHashes != nil} {
		if present {
			kinds++
		}
	}
	if kinds != 1 {
		return nil, errors.New(`give exactly one of "tokens", "sequence_hashes" and "local_hashes"`)
	}
	if q.Tokens == nil && (q.LoRA != "" || q.Namespace != "" || q.MMHashes != nil) {
		return nil, errors.New(`"lora", "namespace" and "mm_hashes" go with "tokens" only`)
	}
	switch {
	case q.SequenceHashes != nil:
		return u64s(q.SequenceHashes), nil
	case q.LocalHashes != nil:
		return ckf.AppendSequenceHashes(nil, u64s(q.LocalHashes)), nil
	}
	sem := s.pools[0].semantics
	if sem.BlockSize <= 0 {
		return nil, fmt.Errorf("pool %s declares no block size: pass --block-size", s.pools[0].name)
	}
	if n := 4 * uint64(len(q.Tokens)); n > consumer.MaxInputBytes {
		return nil, fmt.Errorf("%d tokens: over the %d-byte input limit", len(q.Tokens), consumer.MaxInputBytes)
	}
	o := ckf.HashOptions{Eagle: s.pools[0].eagle}
	for _, l := range q.MMHashes {
		o.MM = append(o.MM, u64s(l))
	}
	return ckf.AppendTokenSequenceHashesWith(nil, q.Tokens, sem.BlockSize, ckf.Salt(q.LoRA, q.Namespace), o), nil
}

func u64s(v []catalog.U64) []uint64 {
	out := make([]uint64, len(v))
	for i, x := range v {
		out[i] = uint64(x)
	}
	return out
}

// answer queries the router for one line and returns the line to print.
func (s *poolSet) answer(r *client.Router, line []byte) any {
	seq, err := s.sequence(line)
	if err != nil {
		return errorLine{Error: err.Error()}
	}
	var res consumer.QueryResult
	if err := r.QuerySequenceHashes(seq, &res); err != nil && !errors.Is(err, consumer.ErrUnavailable) {
		return errorLine{Error: err.Error()}
	}
	a := answer{Depths: map[string]uint32{}}
	var best uint32
	for i, p := range s.pools {
		if res.Mask&(1<<i) == 0 {
			a.NotReady = append(a.NotReady, p.name)
			continue
		}
		d := res.Depths[i]
		a.Depths[p.name] = d
		if d > best {
			best, a.Best = d, &s.pools[i].name
		}
	}
	return a
}
