package wire_test

import (
	"encoding/hex"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var hexToken = regexp.MustCompile(`^([0-9a-f]{2})+$`)

// TestDocs_WorkedExample keeps the annotated delta in docs/wire.md §5 equal
// to what the encoder writes: the leading hex tokens of each line of the
// example's code block, concatenated, must be the Writer's output.
func TestDocs_WorkedExample(t *testing.T) {
	doc, err := os.ReadFile("../docs/wire.md")
	if err != nil {
		t.Skipf("docs not available: %v", err)
	}
	s := string(doc)
	i := strings.Index(s, "## 5.")
	require.GreaterOrEqual(t, i, 0, "docs/wire.md has no section 5")
	s = s[i:]
	s = s[strings.Index(s, "```")+3:]
	s = s[:strings.Index(s, "```")]
	var got strings.Builder
	for _, line := range strings.Split(s, "\n") {
		for _, tok := range strings.Fields(line) {
			if !hexToken.MatchString(tok) {
				break
			}
			got.WriteString(tok)
		}
	}
	want := "00000066" + goldenFrames["delta"]
	require.Equal(t, want, got.String(), "docs example")
	_, err = hex.DecodeString(got.String())
	require.NoError(t, err)
}
