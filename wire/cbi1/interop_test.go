package cbi1_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
)

const debianPython = "/usr/bin/python3"

// python returns the interpreter for testdata/cbi1_check.py, or skips.
func python(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(debianPython); err != nil {
		t.Skip("CBI1 interop needs Debian's /usr/bin/python3 with python3-xxhash (apt-get install -y python3 python3-xxhash)")
	}
	if err := exec.Command(debianPython, "-c", "import xxhash").Run(); err != nil {
		t.Skip("CBI1 interop needs python3-xxhash for /usr/bin/python3 (apt-get install -y python3-xxhash)")
	}
	return debianPython
}

// pyFrame is what testdata/cbi1_check.py prints for one frame.
type pyFrame struct {
	OK           bool     `json:"ok"`
	Reason       string   `json:"reason"`
	Flags        uint16   `json:"flags"`
	Seed         string   `json:"seed"`
	BucketCount  uint64   `json:"bucket_count"`
	DCID         string   `json:"dc_id"`
	Epoch        string   `json:"epoch"`
	ChunkIndex   uint32   `json:"chunk_index"`
	ChunkCount   uint32   `json:"chunk_count"`
	BucketOffset string   `json:"bucket_offset"`
	Words        []string `json:"words"`
	BaseEpoch    string   `json:"base_epoch"`
	Images       [][2]any `json:"images"`
}

// describe renders a Go decode result in the script's terms.
func describe(f *cbi1.Frame, err error) pyFrame {
	if err != nil {
		reasons := map[error]string{
			cbi1.ErrTruncated: "truncated", cbi1.ErrFrameTooLarge: "too_large", cbi1.ErrMagic: "magic",
			cbi1.ErrWireVersion: "wire_version", cbi1.ErrChecksum: "checksum", cbi1.ErrFormat: "format",
			cbi1.ErrFlags: "flags", cbi1.ErrMalformed: "malformed", cbi1.ErrLimitExceeded: "limit",
		}
		for s, name := range reasons {
			if errors.Is(err, s) {
				return pyFrame{Reason: name}
			}
		}
		return pyFrame{Reason: err.Error()}
	}
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	p := pyFrame{OK: true, Flags: uint16(f.Kind), Seed: u(f.Format.Seed), BucketCount: f.Format.BucketCount, DCID: u(f.DCID), Epoch: u(f.Epoch)}
	switch f.Kind {
	case cbi1.KindSnapshotChunk:
		p.ChunkIndex, p.ChunkCount, p.BucketOffset = f.ChunkIndex, f.ChunkCount, u(f.BucketOffset)
		p.Words = []string{}
		for _, w := range f.Words {
			p.Words = append(p.Words, u(w))
		}
	case cbi1.KindDelta:
		p.BaseEpoch = u(f.BaseEpoch)
		p.Images = [][2]any{}
		for _, im := range f.Images {
			p.Images = append(p.Images, [2]any{float64(im.Bucket), u(im.Word)})
		}
	}
	return p
}

// randomFrames encodes frames of every kind with this package, and then
// corrupts copies of them one field at a time.
func randomFrames(t *testing.T, r *rand.Rand) [][]byte {
	var out [][]byte
	for range 40 {
		n := uint64(2) << r.IntN(10)
		format := ckf.NewFormat(r.Uint64(), n)
		var f cbi1.Frame
		if r.IntN(2) == 0 {
			words := make([]uint64, r.IntN(int(n)+1))
			for i := range words {
				words[i] = r.Uint64() & (uint64(r.IntN(2)) * ^uint64(0))
			}
			count := uint32(1 + r.IntN(4))
			f = cbi1.Frame{Header: cbi1.Header{Kind: cbi1.KindSnapshotChunk}, ChunkIndex: uint32(r.IntN(int(count))), ChunkCount: count,
				BucketOffset: uint64(r.IntN(int(n) - len(words) + 1)), Words: words}
		} else {
			images := make([]ckf.BucketImage, r.IntN(20))
			for i := range images {
				images[i] = ckf.BucketImage{Bucket: uint32(r.IntN(int(n))), Word: r.Uint64()}
			}
			f = cbi1.Frame{Header: cbi1.Header{Kind: cbi1.KindDelta}, BaseEpoch: r.Uint64(), Images: images}
		}
		f.Format, f.DCID, f.Epoch = format, r.Uint64(), r.Uint64()
		b, err := cbi1.AppendFrame(nil, &f)
		require.NoError(t, err)
		out = append(out, b)
		bad := append([]byte(nil), b...)
		at := r.IntN(len(bad))
		bad[at] ^= byte(1 << r.IntN(8))
		out = append(out, bad, reseal(append([]byte(nil), bad...)), b[:r.IntN(len(b))])
	}
	return out
}

func TestInterop_PythonDecodesGo(t *testing.T) {
	py := python(t)
	r := rand.New(rand.NewPCG(1, 2))
	frames := append(randomFrames(t, r), golden(t, goldenDelta), golden(t, goldenEmptyDelta), golden(t, goldenReadmeChunk))
	var in bytes.Buffer
	for _, b := range frames {
		in.WriteString(hex.EncodeToString(b) + "\n")
	}
	cmd := exec.Command(py, "testdata/cbi1_check.py", "decode")
	cmd.Stdin, cmd.Stderr = &in, os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, len(frames))
	accepted := 0
	for i, line := range lines {
		var got pyFrame
		require.NoError(t, json.Unmarshal([]byte(line), &got))
		var f cbi1.Frame
		want := describe(&f, cbi1.Decode(frames[i], &f))
		assert.Equal(t, want, got, "frame %d: %x", i, frames[i])
		if got.OK {
			accepted++
		}
	}
	assert.Greater(t, accepted, 40, "most frames are valid")
	assert.Less(t, accepted, len(frames)-40, "many are corrupt")
}

func TestInterop_GoDecodesPython(t *testing.T) {
	py := python(t)
	cmd := exec.Command(py, "testdata/cbi1_check.py", "encode")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, 3)
	for _, line := range lines {
		var c struct {
			Name  string  `json:"name"`
			Hex   string  `json:"hex"`
			Frame pyFrame `json:"frame"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &c))
		b, err := hex.DecodeString(c.Hex)
		require.NoError(t, err)
		var f cbi1.Frame
		err = cbi1.Decode(b, &f)
		require.NoError(t, err, c.Name)
		assert.Equal(t, c.Frame, describe(&f, err), c.Name)
		again, err := cbi1.AppendFrame(nil, &f)
		require.NoError(t, err)
		assert.Equal(t, b, again, "%s: Go re-encodes Python's bytes exactly", c.Name)
	}
}
