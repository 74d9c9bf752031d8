// Package lint checks the project's shape mechanically, so no reviewer has to
// police it:
//
//   - the import graph: every package of the module, with its tests, imports
//     exactly what the table [graph] allows, and every allowance is used;
//   - the contract references: every "SPEC §N" in code and docs names a
//     section of docs/SPEC.md;
//   - the design references: every docs/RATIONALE.md "Why …?" cited in code
//     and docs is a heading of docs/RATIONALE.md.
package lint

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/ckfrelay/ckfrelay"

// root is the module root seen from this package.
const root = "../.."

// rule is what one package may import beyond the standard library. Project
// packages are written relative to the module ("ckf", "internal/hub"),
// third-party ones by module path, which also covers the module's
// subpackages ("github.com/tetratelabs/wazero").
type rule struct {
	imports []string // imports of the package's own (non-test) files
	tests   []string // further imports of its _test.go files (internal and external)
}

// graph pins the import graph of every package in the module, as it is.
// Imports flow one way: ckf ← wire ← consumer ← client, with producer beside
// consumer, and wasm/host never importing client (it implements client.Lanes
// structurally). Public packages (ckf, wire, consumer, client, wasm/host)
// import nothing under internal/.
//
// To add a package, add one line with exactly what it imports; a failing run
// prints that line. An allowance no import uses fails too, so the table
// never says more than the code does.
var graph = map[string]rule{
	"ckf": {
		imports: []string{"github.com/zeebo/xxh3"},
		tests:   []string{"github.com/bits-and-blooms/bloom/v3", "github.com/seiflotfy/cuckoofilter", "pgregory.net/rapid"},
	},
	"wire": {
		imports: []string{"ckf"},
		tests:   []string{"github.com/vmihailenco/msgpack/v5", "pgregory.net/rapid"},
	},
	"wire/cbi1": {
		imports: []string{"ckf", "github.com/zeebo/xxh3"},
	},
	"consumer": {
		imports: []string{"ckf", "wire"},
		tests:   []string{"pgregory.net/rapid"},
	},
	"producer": {
		imports: []string{"ckf", "golang.org/x/sync"},
		tests:   []string{"pgregory.net/rapid"},
	},
	"client": {
		imports: []string{"ckf", "client/natsjs", "consumer", "wire", "wire/cbi1", "wire/kvrelay", "wire/kvrelay/kvrelaypb", "github.com/nats-io/nats.go", "google.golang.org/grpc", "google.golang.org/protobuf"},
		tests:   []string{"internal/testing/natstest", "internal/server", "wasm/host", "golang.org/x/net/http2"},
	},
	"client/natsjs": {},
	"wasm/abi": {
		imports: []string{"ckf", "consumer", "wire"},
	},
	"wasm/guest": {
		imports: []string{"ckf", "consumer", "wasm/abi", "wire"},
	},
	"wasm/host": {
		imports: []string{"ckf", "consumer", "wasm/abi", "github.com/tetratelabs/wazero"},
		tests:   []string{"client", "internal/integration/conformance", "internal/wasmbuild", "wire"},
	},
	"internal/hub": {
		imports: []string{"ckf"},
	},
	"internal/server": {
		imports: []string{"ckf", "client/natsjs", "internal/catalog", "internal/connlimit", "internal/hub", "internal/natspub", "internal/source", "internal/persist", "internal/replica", "internal/source/dynamonats", "internal/source/zmq", "producer", "wire",
			"github.com/nats-io/nats.go", "github.com/prometheus/client_golang", "github.com/zeebo/xxh3", "golang.org/x/sys"},
		tests: []string{"client", "consumer", "internal/grpcserver", "internal/testing/natstest", "internal/sim/engine", "internal/testing/streamprobe"},
	},
	"internal/sim/workload": {
		imports: []string{"ckf", "github.com/zeebo/xxh3"},
	},
	"internal/sim/replay": {
		imports: []string{"ckf", "client", "consumer", "internal/sim/workload", "producer", "wire"},
		tests:   []string{"wasm/host"},
	},
	"internal/integration/conformance": {
		imports: []string{"ckf", "client", "consumer", "internal/catalog", "producer", "wasm/abi", "wire"},
		tests:   []string{"wasm/host", "github.com/tetratelabs/wazero"},
	},
	"internal/integration/e2e": {
		tests: []string{"ckf", "client", "consumer", "producer", "wire", "pgregory.net/rapid"},
	},
	"wire/kvrelay": {
		imports: []string{"ckf", "wire/kvrelay/kvrelaypb", "google.golang.org/grpc", "google.golang.org/protobuf"},
		tests:   []string{"wire/cbi1"},
	},
	"wire/kvrelay/kvrelaypb": {imports: []string{"google.golang.org/grpc", "google.golang.org/protobuf"}},
	"internal/grpcserver": {
		imports: []string{"ckf", "internal/connlimit", "internal/hub", "wire/kvrelay", "wire/kvrelay/kvrelaypb", "internal/server", "wire/cbi1",
			"github.com/prometheus/client_golang", "github.com/zeebo/xxh3", "google.golang.org/grpc", "google.golang.org/protobuf"},
		tests: []string{"client", "consumer", "internal/testing/h2peer", "internal/testing/natstest", "internal/testing/streamtable", "wire", "golang.org/x/net"},
	},
	"internal/connlimit":           {},
	"internal/testing/h2peer":      {imports: []string{"golang.org/x/net"}},
	"internal/catalog":             {imports: []string{"ckf"}},
	"internal/testing/streamtable": {imports: []string{"wire", "github.com/stretchr/testify"}},
	"internal/testing/streamprobe": {imports: []string{"consumer", "wire"}, tests: []string{"internal/integration/conformance"}},
	"internal/source":              {imports: []string{"ckf", "internal/catalog", "producer", "github.com/vmihailenco/msgpack/v5"}},
	"internal/wasmbuild":           {},
	"internal/cmd/benchsummary":    {},
	"internal/cmd/wasirun":         {imports: []string{"github.com/tetratelabs/wazero"}},
	"internal/sim/replay/report":   {imports: []string{"internal/sim/replay", "gonum.org/v1/plot"}},
	"internal/sim/replay/replaycmd": {
		imports: []string{"client", "consumer", "internal/sim/replay", "internal/sim/replay/report", "internal/sim/workload", "wasm/host", "github.com/schollz/progressbar/v3", "golang.org/x/term"},
	},
	"internal/cmd/nativeconsumer": {imports: []string{"client", "internal/integration/conformance", "wasm/abi"}},
	"internal/lint":               {},
	"internal/persist":            {imports: []string{"ckf", "producer", "wire", "github.com/cockroachdb/pebble/v2"}},
	"internal/replica": {
		imports: []string{"ckf", "internal/jsexpect", "producer", "github.com/nats-io/nats.go", "golang.org/x/sys"},
		tests:   []string{"internal/testing/natstest", "pgregory.net/rapid"},
	},
	"internal/source/zmq": {
		imports: []string{"ckf", "internal/catalog", "internal/connlimit", "internal/source", "producer", "wire", "github.com/go-zeromq/zmq4", "github.com/go-zeromq/zmq4/transport", "github.com/vmihailenco/msgpack/v5", "github.com/zeebo/xxh3"},
		tests:   []string{"internal/sim/engine", "pgregory.net/rapid"},
	},
	"internal/sim/engine":       {imports: []string{"ckf", "github.com/go-zeromq/zmq4", "github.com/vmihailenco/msgpack/v5"}},
	"internal/natspub":          {imports: []string{"ckf", "client/natsjs", "internal/hub", "internal/jsexpect", "wire", "github.com/nats-io/nats.go"}, tests: []string{"client", "consumer", "internal/testing/natstest"}},
	"internal/jsexpect":         {imports: []string{"github.com/nats-io/nats.go"}, tests: []string{"internal/testing/natstest"}},
	"internal/testing/natstest": {imports: []string{"github.com/nats-io/nats-server/v2", "github.com/nats-io/nats.go"}},
	"internal/source/dynamonats": {
		imports: []string{"ckf", "internal/catalog", "internal/source", "producer", "wire", "github.com/nats-io/nats.go", "github.com/vmihailenco/msgpack/v5"},
		tests:   []string{"internal/testing/natstest"},
	},
	"internal/sim/demo": {
		imports: []string{"ckf", "client", "consumer", "internal/catalog", "internal/grpcserver", "internal/server", "internal/sim/engine", "internal/sim/replay", "internal/sim/replay/report", "internal/sim/workload", "wasm/host", "wire", "wire/kvrelay/kvrelaypb", "github.com/nats-io/nats-server/v2", "google.golang.org/grpc"},
	},
	"internal/serve": {imports: []string{"internal/grpcserver", "internal/server"}},
	"internal/tail": {
		imports: []string{"ckf", "client", "internal/catalog", "wire", "wire/cbi1", "wire/kvrelay", "wire/kvrelay/kvrelaypb", "google.golang.org/grpc"},
		tests:   []string{"internal/grpcserver", "internal/server"},
	},
	"internal/query": {imports: []string{"ckf", "client", "consumer", "internal/catalog", "internal/tail", "wasm/host", "wire/kvrelay/kvrelaypb", "google.golang.org/grpc"}},
	"cmd/relay": {
		imports: []string{"internal/query", "internal/serve", "internal/sim/demo", "internal/sim/replay/replaycmd", "internal/tail"},
		tests: []string{"ckf", "client", "consumer", "internal/catalog", "internal/server", "internal/sim/engine", "internal/sim/replay/report", "internal/source", "internal/source/dynamonats", "internal/testing/h2peer", "internal/testing/natstest", "internal/testing/streamprobe", "internal/testing/streamtable", "producer", "wasm/host", "wire",
			"wire/kvrelay", "wire/kvrelay/kvrelaypb", "github.com/nats-io/nats.go", "github.com/vmihailenco/msgpack/v5",
			"google.golang.org/grpc", "google.golang.org/protobuf"},
	},
	"cmd/wasmbuild": {
		imports: []string{"internal/wasmbuild"},
	},
}

// public lists the packages users import; everything else lives under
// internal/ (or is a command).
var public = []string{"ckf", "wire", "wire/cbi1", "wire/kvrelay", "wire/kvrelay/kvrelaypb", "producer", "consumer", "client", "client/natsjs", "wasm/abi", "wasm/host"}

// anyTest lists what every package's tests may import: the project's test
// assertion library.
var anyTest = []string{"github.com/stretchr/testify"}

type goPackage struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// listPackages returns the module's packages and, for every third-party
// import path any of them or their tests use, its module path.
func listPackages(t *testing.T) ([]goPackage, map[string]string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", module+"/...").Output()
	require.NoError(t, err, "go list")
	var pkgs []goPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p goPackage
		require.NoError(t, dec.Decode(&p), "decode go list output")
		pkgs = append(pkgs, p)
	}
	out, err = exec.Command("go", "list", "-deps", "-test", "-f", "{{if .Module}}{{.ImportPath}} {{.Module.Path}}{{end}}", module+"/...").Output()
	require.NoError(t, err, "go list -deps")
	modules := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if path, mod, ok := strings.Cut(sc.Text(), " "); ok && !strings.Contains(path, "[") {
			modules[path] = mod
		}
	}
	return pkgs, modules
}

func TestImports_MatchGraph(t *testing.T) {
	pkgs, modules := listPackages(t)
	seen := map[string]bool{}
	usedByTests := map[string]bool{}
	for _, p := range pkgs {
		rel := relative(p.ImportPath)
		seen[rel] = true
		imports := projectAndThirdParty(p.Imports, rel)
		tests := projectAndThirdParty(append(slices.Clone(p.TestImports), p.XTestImports...), rel)
		r, ok := graph[rel]
		if !ok {
			t.Errorf("package %s is not in the import graph of internal/lint/lint_test.go.\n"+
				"Add this line to the table `graph` (what it imports today; check it points downstream):\n\t%s\n"+
				"A new package belongs under internal/ unless it joins the public API (%s).",
				rel, suggest(rel, imports, tests, modules), strings.Join(public, ", "))
			continue
		}
		for _, imp := range imports {
			if slices.Contains(public, rel) && strings.HasPrefix(imp, "internal/") {
				t.Errorf("public package %s imports %s: the public API must not depend on internal packages", rel, imp)
			}
			if !permitted(imp, r.imports) {
				t.Errorf("%s imports %s; its rule in internal/lint allows %v", rel, imp, r.imports)
			}
		}
		for _, imp := range tests {
			for _, a := range anyTest {
				if permitted(imp, []string{a}) {
					usedByTests[a] = true
				}
			}
			if !permitted(imp, r.imports) && !permitted(imp, r.tests) && !permitted(imp, anyTest) {
				t.Errorf("%s's tests import %s; its rule in internal/lint allows %v, and for tests %v", rel, imp, r.imports, r.tests)
			}
		}
		for _, a := range r.imports {
			if !slices.ContainsFunc(imports, func(imp string) bool { return permitted(imp, []string{a}) }) {
				t.Errorf("internal/lint allows %s to import %s, which it does not: drop the allowance", rel, a)
			}
		}
		for _, a := range r.tests {
			if !slices.ContainsFunc(tests, func(imp string) bool {
				return permitted(imp, []string{a}) && !permitted(imp, r.imports) && !permitted(imp, anyTest)
			}) {
				t.Errorf("internal/lint allows %s's tests to import %s, which they do not (or the package itself or anyTest allows it): drop the allowance", rel, a)
			}
		}
	}
	for _, a := range anyTest {
		if !usedByTests[a] {
			t.Errorf("internal/lint lets every test import %s, which no test does: drop it from anyTest", a)
		}
	}
	for rel := range graph {
		if !seen[rel] {
			t.Errorf("internal/lint has a rule for %s, which is not a package of the module: drop it", rel)
		}
	}
}

// relative returns a project import path relative to the module.
func relative(path string) string {
	return strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
}

// projectAndThirdParty returns the sorted, distinct imports that are not the
// standard library, project ones relative to the module, leaving out self
// (an external test package imports the package it tests).
func projectAndThirdParty(imports []string, self string) []string {
	var out []string
	for _, imp := range imports {
		if isStdlib(imp) {
			continue
		}
		if strings.HasPrefix(imp, module+"/") {
			imp = relative(imp)
		}
		if imp != self && !slices.Contains(out, imp) {
			out = append(out, imp)
		}
	}
	sort.Strings(out)
	return out
}

// permitted reports whether imp (relative when it is a project package) is
// allowed by rules: a project package by its exact path, a third-party one by
// its module path or any prefix ending at a path element.
func permitted(imp string, rules []string) bool {
	for _, r := range rules {
		if imp == r || (!isProject(r) && strings.HasPrefix(imp, r+"/")) {
			return true
		}
	}
	return false
}

// isProject reports whether a rule names a project package (no dot in its
// first element).
func isProject(path string) bool { return isStdlib(path) }

// isStdlib reports whether an import path belongs to the standard library:
// its first element has no dot.
func isStdlib(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

// suggest writes the table line for a package from what it imports, with
// third-party imports reduced to their module paths.
func suggest(rel string, imports, tests []string, modules map[string]string) string {
	reduce := func(xs []string) []string {
		var out []string
		for _, x := range xs {
			if m, ok := modules[x]; ok && m != module {
				x = m
			}
			if !slices.Contains(out, x) {
				out = append(out, x)
			}
		}
		return out
	}
	imports = reduce(imports)
	tests = slices.DeleteFunc(reduce(tests), func(x string) bool { return slices.Contains(imports, x) || permitted(x, anyTest) })
	quote := func(xs []string) string {
		q := make([]string, len(xs))
		for i, x := range xs {
			q[i] = fmt.Sprintf("%q", x)
		}
		return strings.Join(q, ", ")
	}
	var fields []string
	if len(imports) > 0 {
		fields = append(fields, "imports: []string{"+quote(imports)+"}")
	}
	if len(tests) > 0 {
		fields = append(fields, "tests: []string{"+quote(tests)+"}")
	}
	return fmt.Sprintf("%q: {%s},", rel, strings.Join(fields, ", "))
}

// sources returns the text of every Go and Markdown file of the repository
// (testdata and hidden directories aside), comment continuations joined, so
// a reference broken across comment lines reads as one line.
func sources(t *testing.T) map[string]string {
	t.Helper()
	join := regexp.MustCompile(`[ \t]*\n[ \t]*(//[ \t]?)?`)
	files := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		files[filepath.ToSlash(rel)] = join.ReplaceAllString(string(b), " ")
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return files
}

// headings returns the headings of a Markdown file at the given levels
// ("## ", "### "), without the marker.
func headings(t *testing.T, path string, levels ...string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	require.NoError(t, err)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, l := range levels {
			if strings.HasPrefix(line, l) {
				out = append(out, strings.TrimSpace(strings.TrimPrefix(line, l)))
			}
		}
	}
	return out
}

var (
	specRef     = regexp.MustCompile(`SPEC §(\d+(?:\.\d+)*)(?:\s*[–-]\s*§?(\d+(?:\.\d+)*))?`)
	specSelfRef = regexp.MustCompile(`§(\d+(?:\.\d+)*)`)
	specSection = regexp.MustCompile(`^(\d+(?:\.\d+)*)\.? `)
)

// TestSpecReferences_NameSections checks that every "SPEC §N" (and every
// "§N" inside docs/SPEC.md) names a numbered section of docs/SPEC.md.
func TestSpecReferences_NameSections(t *testing.T) {
	sections := map[string]bool{}
	for _, h := range headings(t, "docs/SPEC.md", "## ", "### ") {
		if m := specSection.FindStringSubmatch(h); m != nil {
			sections[m[1]] = true
		}
	}
	require.NotEmpty(t, sections, "no numbered sections in docs/SPEC.md")
	refs := 0
	for path, text := range sources(t) {
		var found [][]string
		if path == "docs/SPEC.md" {
			found = specSelfRef.FindAllStringSubmatch(text, -1)
		} else {
			found = specRef.FindAllStringSubmatch(text, -1)
		}
		for _, m := range found {
			for _, n := range m[1:] {
				if n == "" {
					continue
				}
				refs++
				if !sections[n] {
					t.Errorf("%s cites SPEC §%s, which docs/SPEC.md does not have", path, n)
				}
			}
		}
	}
	require.Greater(t, refs, 50, "the check found too few references to be reading the sources")
}

// rationaleRef matches a citation of RATIONALE entries, which all ask
// "Why …?": `RATIONALE.md "Why …?"`, `RATIONALE.md, "Why …?"`,
// `RATIONALE.md ("Why …?")`, and further titles joined by "," or "and".
var rationaleRef = regexp.MustCompile(`RATIONALE\.md[,(\s]*((?:"Why [^"]*"(?:\s*(?:,|and)\s*)?)+)`)

// TestRationaleReferences_NameHeadings checks that every docs/RATIONALE.md
// "…" citation names a "## " or "### " heading of docs/RATIONALE.md (entries
// are grouped by area under "## " headings); an ellipsis in the citation
// stands for any text.
func TestRationaleReferences_NameHeadings(t *testing.T) {
	heads := append(headings(t, "docs/RATIONALE.md", "## "), headings(t, "docs/RATIONALE.md", "### ")...)
	require.NotEmpty(t, heads)
	quoted := regexp.MustCompile(`"([^"]+)"`)
	refs := 0
	for path, text := range sources(t) {
		for _, m := range rationaleRef.FindAllStringSubmatch(text, -1) {
			for _, q := range quoted.FindAllStringSubmatch(m[1], -1) {
				refs++
				cite := q[1]
				if !slices.ContainsFunc(heads, func(h string) bool { return matchesCitation(h, cite) }) {
					t.Errorf("%s cites docs/RATIONALE.md %q, which is not a heading there", path, cite)
				}
			}
		}
	}
	require.Greater(t, refs, 5, "the check found too few references to be reading the sources")
}

// matchesCitation reports whether heading h is what cite names: equal, or
// equal with each "…" in cite standing for any text.
func matchesCitation(h, cite string) bool {
	parts := strings.Split(cite, "…")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(strings.TrimSpace(p))
	}
	return regexp.MustCompile(`^` + strings.Join(parts, `.*`) + `$`).MatchString(h)
}

// plainFailAllowed lists the test files and directories that still call
// t.Fatal*/t.Error* directly, each with why. Entries only go away: an entry
// with no such call left fails the test, so convert, then delete the line.
var plainFailAllowed = map[string]string{}

// testingTypes are the parameter types whose Fatal*/Error* the rule reports.
var testingTypes = map[string]bool{"*testing.T": true, "*testing.B": true, "*testing.F": true, "testing.TB": true, "*rapid.T": true}

// TestTests_UseTestify: tests state their checks with testify (require stops
// the test, assert records and goes on), one way across the repository, so a
// failure always prints expected and actual the same way. The lint package
// itself is exempt: its messages name the fix.
func TestTests_UseTestify(t *testing.T) {
	found := map[string]int{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules" || rel == "internal/lint") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, pos := range plainFailCalls(f) {
			allowed := ""
			for entry := range plainFailAllowed {
				if rel == entry || strings.HasSuffix(entry, "/") && strings.HasPrefix(rel, entry) {
					allowed = entry
				}
			}
			if allowed != "" {
				found[allowed]++
				continue
			}
			p := fset.Position(pos)
			t.Errorf("%s:%d: plain %s: use require.X / assert.X from testify instead "+
				"(t.Fatal* → require.Equal/NoError/ErrorIs/Len/True…, t.Error* → the same in assert; keep the message as msgAndArgs; "+
				"in a timed benchmark loop keep the if and call require.Fail inside it, see docs/RATIONALE.md \"Why do benchmark loops keep…?\")",
				rel, p.Line, callName(f, pos))
		}
		return nil
	})
	require.NoError(t, err)
	for entry := range plainFailAllowed {
		if found[entry] == 0 {
			t.Errorf("plainFailAllowed[%q]: no plain t.Fatal*/t.Error* call is left there; delete the entry so the list only shrinks", entry)
		}
	}
}

// plainFailCalls returns the positions of X.Fatal/Fatalf/Error/Errorf calls
// in f whose X is a parameter of one of testingTypes.
func plainFailCalls(f *ast.File) []token.Pos {
	var out []token.Pos
	var scopes []map[string]bool
	declared := func(name string) bool {
		for i := len(scopes) - 1; i >= 0; i-- {
			if v, ok := scopes[i][name]; ok {
				return v
			}
		}
		return false
	}
	var walk func(n ast.Node) bool
	enter := func(ft *ast.FuncType, body *ast.BlockStmt) {
		s := map[string]bool{}
		for _, fld := range ft.Params.List {
			typ := types.ExprString(fld.Type)
			for _, name := range fld.Names {
				s[name.Name] = testingTypes[typ]
			}
		}
		scopes = append(scopes, s)
		ast.Inspect(body, walk)
		scopes = scopes[:len(scopes)-1]
	}
	walk = func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.FuncDecl:
			if x.Body != nil {
				enter(x.Type, x.Body)
			}
			return false
		case *ast.FuncLit:
			enter(x.Type, x.Body)
			return false
		case *ast.CallExpr:
			sel, ok := x.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			switch sel.Sel.Name {
			case "Fatal", "Fatalf", "Error", "Errorf":
				if id, ok := sel.X.(*ast.Ident); ok && declared(id.Name) {
					out = append(out, x.Pos())
				}
			}
		}
		return true
	}
	ast.Inspect(f, walk)
	return out
}

// callName renders the call at pos as "t.Fatalf" for the message.
func callName(f *ast.File, pos token.Pos) string {
	name := "call"
	ast.Inspect(f, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok && c.Pos() == pos {
			name = types.ExprString(c.Fun)
			return false
		}
		return true
	})
	return name
}
