package lint

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// layoutTables reads README.md's "## Layout" section and returns the paths
// its two tables list in their first column: the public table's and the
// other's, each without its trailing slash.
func layoutTables(t *testing.T, readme string) (public, other []string) {
	t.Helper()
	_, section, ok := strings.Cut(readme, "\n## Layout\n")
	require.True(t, ok, "README.md has no \"## Layout\" section")
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	cell := regexp.MustCompile("^\\| `([^`]+)` \\|")
	var table *[]string
	for line := range strings.SplitSeq(section, "\n") {
		switch {
		case strings.HasPrefix(line, "| public package |"):
			table = &public
		case strings.HasPrefix(line, "| not public |"):
			table = &other
		case table != nil:
			if m := cell.FindStringSubmatch(line); m != nil {
				*table = append(*table, strings.TrimSuffix(m[1], "/"))
			}
		}
	}
	return public, other
}

// README's layout tables list every package of the module exactly once, the
// public table exactly the packages [public] names, and nothing that is not
// there: the tree and the README cannot drift.
func TestReadmeLayout_ListsEveryPackage(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	pub, other := layoutTables(t, string(readme))
	require.NotEmpty(t, pub, "README.md's layout has no public table (a row starting \"| public package |\")")
	require.NotEmpty(t, other, "README.md's layout has no other table (a row starting \"| not public |\")")

	assert.ElementsMatch(t, public, pub, "README.md's public table must list exactly the public packages of internal/lint (%v)", public)

	pkgs, _ := listPackages(t)
	listed := map[string]int{}
	for _, p := range append(slices.Clone(pub), other...) {
		listed[p]++
	}
	for _, p := range pkgs {
		rel := relative(p.ImportPath)
		assert.Equal(t, 1, listed[rel], "package %s must appear once in README.md's layout tables: add a row \"| `%s/` | what it is |\"", rel, rel)
		delete(listed, rel)
	}
	for p := range listed {
		info, err := os.Stat(filepath.Join(root, p))
		assert.True(t, err == nil && info.IsDir(), "README.md's layout lists %s, which is not a directory of the tree: drop or fix the row", p)
	}
}
