// Package lint checks the project's shape mechanically: which package may
// import what (STYLE §5.1–5.2). A backward import or a dependency entering the
// wrong package fails `go test`, so no reviewer has to police it.
package lint

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/ckfrelay/ckfrelay"

// allowed lists, per project package (relative to the module), the non-stdlib
// imports it may have (project packages relative, third-party by path prefix).
// A package missing from the table may import anything but the packages that
// list it as a forbidden importer below.
var allowed = map[string][]string{
	"ckf":               {"github.com/zeebo/xxh3"},
	"wire":              {"ckf", "github.com/vmihailenco/msgpack/v5"},
	"consumer":          {"ckf", "wire", "github.com/zeebo/xxh3"},
	"producer":          {"ckf", "wire", "golang.org/x/sync"},
	"internal/hub":      {"ckf"},
	"internal/persist":  {"ckf", "wire", "producer", "github.com/cockroachdb/pebble/v2"},
	"client":            {"ckf", "consumer", "wire"},
	"internal/workload": {"ckf", "github.com/zeebo/xxh3"},
	"wasm/abi":          {"ckf", "consumer", "wire"},
	"wasm/guest":        {"ckf", "consumer", "wire", "wasm/abi"},
	"wasm/host":         {"ckf", "consumer", "wasm/abi", "github.com/tetratelabs/wazero"},
}

type goPackage struct {
	ImportPath string
	Imports    []string
	Standard   bool
}

func TestImports_PointDownstream(t *testing.T) {
	out, err := exec.Command("go", "list", "-json", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		rules, ok := allowed[rel]
		if !ok {
			continue
		}
		for _, imp := range p.Imports {
			if isStdlib(imp) {
				continue
			}
			if !permitted(imp, rules) {
				t.Errorf("%s imports %s; allowed: %v", rel, imp, rules)
			}
		}
	}
}

func permitted(imp string, rules []string) bool {
	for _, r := range rules {
		if !strings.Contains(r, ".") { // a project package
			r = module + "/" + r
			if imp == r {
				return true
			}
			continue
		}
		if imp == r || strings.HasPrefix(imp, r+"/") {
			return true
		}
	}
	return false
}

// isStdlib reports whether an import path belongs to the standard library:
// its first element has no dot.
func isStdlib(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}
