package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/integration/conformance"
)

// TestRun_AnswersEveryScenarioAsWritten: fed a conformance file, the helper
// prints the native consumer's results, which match the file's expectations
// (the JavaScript tests rely on it being the native consumer's answer).
func TestRun_AnswersEveryScenarioAsWritten(t *testing.T) {
	ss, err := conformance.LoadDir(filepath.Join("..", "..", "..", conformance.Dir))
	require.NoError(t, err)
	require.NotEmpty(t, ss)
	for _, s := range ss {
		in, err := json.Marshal(&s)
		require.NoError(t, err)
		var out bytes.Buffer
		require.NoError(t, run(bytes.NewReader(in), &out), s.Name)
		var got []conformance.Want
		require.NoError(t, json.Unmarshal(out.Bytes(), &got))
		require.Len(t, got, len(s.Steps), s.Name)
		for i := range s.Steps {
			require.Equal(t, s.Steps[i].Want.Code, got[i].Code, "%s step %d", s.Name, i)
		}
	}
	require.Error(t, run(bytes.NewReader([]byte(`{"manifest": "AAAA"}`)), &bytes.Buffer{}))
}
