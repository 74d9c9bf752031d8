// Package conformance is the consumer's cross-implementation test suite
// (SPEC §10, docs/abi.md): scenario files under testdata/conformance, produced
// by the real producer (ckf.Pool + producer.Publisher) and wire encoder, run
// step by step against any [client.Lanes] — the native consumer, the
// WebAssembly module under wazero, and the module under wasmtime (the nested
// module internal/integration/wasmtime, cgo) — and, through
// testdata/conformance/run.mjs, against the module under Node.js. Every
// implementation must produce exactly the results written in the files.
//
// Expected results are not recorded from a consumer run: outcomes, faults
// and sequences are declared by the generator step by step (the SPEC §8.3
// rule each step exercises), and depths, masks and lane digests come from a
// model that only applies the producer's own words and images (gen.go).
//
// Regenerate the files with `go test ./internal/integration/conformance -run
// TestScenarios_UpToDate -update`; the same test fails
// when the files are stale.
package conformance

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/ckfrelay/ckfrelay/internal/catalog"
)

// Scenario is one scenario file: a manifest and steps run in order on a
// fresh consumer.
type Scenario struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Manifest is the abi manifest encoding (docs/abi.md), base64.
	Manifest []byte `json:"manifest"`
	Steps    []Step `json:"steps"`
}

// Op names what a step does.
type Op string

// Step operations.
const (
	OpAssign   Op = "assign"   // Assignment bytes (abi encoding)
	OpRetire   Op = "retire"   // Lane
	OpApply    Op = "apply"    // Frame bytes (wire v1 body, no length prefix)
	OpQuery    Op = "query"    // Kind, Hashes or Tokens (+ BlockSize, Salt; MM, Eagle for kind 3)
	OpContains Op = "contains" // Hash
	OpStatus   Op = "status"   // Lane
	OpWords    Op = "words"    // Lane: digest of the lane's column
)

// U64 is a uint64 carried as a decimal string, so JSON readers without
// 64-bit integers (JavaScript) read it exactly; the same type as the
// relay catalog's.
type U64 = catalog.U64

// Step is one call and its expected result.
type Step struct {
	Op   Op     `json:"op"`
	Note string `json:"note,omitempty"`

	Assignment []byte   `json:"assignment,omitempty"`
	Frame      []byte   `json:"frame,omitempty"`
	Lane       int      `json:"lane,omitempty"`
	Kind       int      `json:"kind,omitempty"` // abi.Query* for OpQuery
	Hashes     []U64    `json:"hashes,omitempty"`
	Tokens     []uint32 `json:"tokens,omitempty"`
	BlockSize  int64    `json:"block_size,omitempty"` // int64: scenarios hold sizes ≥ 2^31, which a 32-bit int cannot
	Salt       U64      `json:"salt,omitempty"`
	// MM and Eagle are the hash options of kind abi.QueryTokensWith:
	// per-block multimodal hashes (list i for block i) and Eagle windows.
	MM    [][]U64 `json:"mm,omitempty"`
	Eagle bool    `json:"eagle,omitempty"`
	Hash  U64     `json:"hash,omitempty"`

	Want Want `json:"want"`
}

// Want is the expected result. Code is the abi status code every export
// returns (≥ 0 success value, < 0 error); the other fields apply per op.
type Want struct {
	Code int32 `json:"code"`

	// OpApply
	Outcome  uint8 `json:"outcome,omitempty"`
	Fault    uint8 `json:"fault,omitempty"`
	ResLane  int   `json:"result_lane"`
	Sequence U64   `json:"sequence,omitempty"`

	// OpQuery
	Mask   uint16   `json:"mask,omitempty"`
	Depths []uint32 `json:"depths,omitempty"`
	Blocks int      `json:"blocks,omitempty"`

	// OpStatus
	Ready     bool  `json:"ready,omitempty"`
	Assigned  bool  `json:"assigned,omitempty"`
	Installed U64   `json:"installed,omitempty"`
	LastEpoch U64   `json:"last_epoch,omitempty"`
	Staging   bool  `json:"staging,omitempty"`
	LastOut   uint8 `json:"last_outcome,omitempty"`
	LastFault uint8 `json:"last_fault,omitempty"`
	// Seed and BucketCount are the lane's format (lane_status bytes 152
	// and 160): its assignment's, else its pin, else 0 and 0.
	Seed        U64 `json:"seed,omitempty"`
	BucketCount U64 `json:"bucket_count,omitempty"`

	// OpWords: hex SHA-256 of the lane's bucket_count words as u64 LE.
	SHA256 string `json:"sha256,omitempty"`
}

// Dir is the scenario directory relative to the module root.
const Dir = "testdata/conformance"

// LoadDir reads every *.json scenario in dir, sorted by file name.
func LoadDir(dir string) ([]Scenario, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []Scenario
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var s Scenario
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, fmt.Errorf("conformance: %s: %w", f, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// Marshal returns the file content of s: indented JSON with a final newline.
func Marshal(s *Scenario) ([]byte, error) {
	b, err := json.MarshalIndent(s, "", " ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
