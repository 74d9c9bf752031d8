package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
)

// quickStart is what README.md's "Quick start" runs: the serve line's pool
// flag, the curl's URL path and body, and the node command's script.
type quickStart struct {
	pool, path, body, script string
}

func readQuickStart(t *testing.T) quickStart {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	_, sec, ok := strings.Cut(string(b), "\n## Quick start\n")
	require.True(t, ok, `README.md has no "## Quick start"`)
	sec, _, _ = strings.Cut(sec, "\n## ")
	var q quickStart
	if m := regexp.MustCompile(`relay serve --listen \S+ --pool (\S+)`).FindStringSubmatch(sec); assert.NotNil(t, m, "the serve line") {
		q.pool = m[1]
	}
	if m := regexp.MustCompile(`curl -s -XPOST 'http://[^/]+(/[^']+)'`).FindStringSubmatch(sec); assert.NotNil(t, m, "the curl URL") {
		q.path = m[1]
	}
	if m := regexp.MustCompile(`(?s) -d '(.*?)'`).FindStringSubmatch(sec); assert.NotNil(t, m, "the curl body") {
		q.body = m[1]
	}
	if m := regexp.MustCompile(`node (\S+\.mjs)`).FindStringSubmatch(sec); assert.NotNil(t, m, "the node command") {
		q.script = m[1]
	}
	return q
}

// README's quick start works as written: the posted blocks' tokens_hash are
// the local hashes of the tokens 1..32 it names, the POST is admitted, tail
// shows their delta, and the JavaScript example finds both blocks.
func TestReadme_QuickStart(t *testing.T) {
	q := readQuickStart(t)
	var evs []struct {
		Event struct {
			Data struct {
				Stored struct {
					Blocks []struct {
						TokensHash uint64 `json:"tokens_hash"`
					} `json:"blocks"`
				} `json:"stored"`
			} `json:"data"`
		} `json:"event"`
	}
	require.NoError(t, json.Unmarshal([]byte(q.body), &evs), "the curl body is JSON")
	require.Len(t, evs, 1)
	tokens := make([]uint32, 32)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	want := ckf.AppendLocalBlockHashes(nil, tokens, 16, ckf.Salt("", ""))
	var got []uint64
	for _, b := range evs[0].Event.Data.Stored.Blocks {
		got = append(got, b.TokensHash)
	}
	assert.Equal(t, want, got, "the README's tokens_hash values are the local hashes of tokens 1..32")

	rl := startRelay(t, "--listen", "127.0.0.1:0", "--pool", q.pool)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tail := exec.CommandContext(ctx, relayBinary(t), "tail", "--relay", rl.base, "--pool", "dc-a")
	out, err := tail.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, tail.Start())
	t.Cleanup(func() { cancel(); _ = tail.Wait() })
	lines := bufio.NewScanner(out)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	require.True(t, lines.Scan(), "tail prints the snapshot")
	assert.Contains(t, lines.Text(), `"kind":"snapshot_chunk"`)

	resp, err := http.Post(rl.base+q.path, "application/json", strings.NewReader(q.body))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	var delta map[string]any
	for delta == nil && lines.Scan() {
		var f map[string]any
		require.NoError(t, json.Unmarshal(lines.Bytes(), &f))
		if f["kind"] == "delta" {
			delta = f
		}
	}
	require.NotNil(t, delta, "tail prints the POST's delta")
	assert.Len(t, delta["images"], 2, "two blocks, two bucket images")

	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found: the quick start's JavaScript step is skipped (install nodejs >= 20)")
	}
	cmd := exec.CommandContext(ctx, node, q.script)
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "RELAY_URL="+rl.base)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	assert.Contains(t, string(b), "dc-a holds 2 leading blocks")
}
