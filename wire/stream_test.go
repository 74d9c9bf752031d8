package wire_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

func TestStream_RoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := wire.NewWriter(&buf, 0)
	frames := sampleFrames()
	order := []string{"snapshot_chunk", "delta", "heartbeat", "drain_marker", "close"}
	for _, name := range order {
		f := frames[name]
		require.NoError(t, w.WriteFrame(&f), "WriteFrame %s", name)
	}
	// One byte at a time: the reader must not depend on read sizes.
	r := wire.NewReader(iotest.OneByteReader(&buf), 0)
	var f wire.Frame
	for _, name := range order {
		require.NoError(t, r.ReadFrame(&f), "ReadFrame %s", name)
		want := frames[name]
		frameEqual(t, &f, &want)
	}
	require.Same(t, io.EOF, r.ReadFrame(&f), "at end")
}

func TestWriter_LengthPrefix(t *testing.T) {
	var buf bytes.Buffer
	f := sampleFrames()["drain_marker"]
	require.NoError(t, wire.NewWriter(&buf, 0).WriteFrame(&f))
	want := mustHex("00000008" + goldenFrames["drain_marker"])
	require.Equal(t, want, buf.Bytes(), "got %x, want %x", buf.Bytes(), want)
}

func TestWriter_FrameTooLarge(t *testing.T) {
	var buf bytes.Buffer
	f := sampleFrames()["close"]
	f.Close.Message = string(make([]byte, 100))
	w := wire.NewWriter(&buf, 64)
	err := w.WriteFrame(&f)
	require.ErrorIs(t, err, wire.ErrFrameTooLarge)
	require.Equal(t, 0, buf.Len(), "wrote %d bytes, want 0", buf.Len())
	require.ErrorIs(t, w.WriteRaw(make([]byte, 65)), wire.ErrFrameTooLarge, "WriteRaw")
}

// countingReader counts the bytes handed out so a test can prove the
// reader stopped at the prefix.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestReader_Errors(t *testing.T) {
	good := mustHex("00000008" + goldenFrames["drain_marker"])
	tests := []struct {
		name   string
		stream []byte
		limit  int
		want   error
		sticky bool
	}{
		{"prefix cut", good[:2], 0, wire.ErrTruncated, true},
		{"body cut", good[:7], 0, wire.ErrTruncated, true},
		{"over limit", good, 7, wire.ErrFrameTooLarge, true},
		{"huge prefix", []byte{0xff, 0xff, 0xff, 0xff}, 0, wire.ErrFrameTooLarge, true},
		{"empty frame", []byte{0, 0, 0, 0}, 0, wire.ErrMalformed, false},
		{"bad body", mustHex("00000002" + "9101"), 0, wire.ErrMalformed, false},
		{"trailing inside frame", mustHex("00000009" + goldenFrames["drain_marker"] + "c0"), 0, wire.ErrTrailingBytes, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stream := append([]byte(nil), tt.stream...)
			if tt.want != wire.ErrTruncated {
				stream = append(stream, good...)
			}
			cr := &countingReader{r: bytes.NewReader(stream)}
			r := wire.NewReader(cr, tt.limit)
			var f wire.Frame
			err := r.ReadFrame(&f)
			require.ErrorIs(t, err, tt.want)
			require.False(t, errors.Is(err, wire.ErrFrameTooLarge) && cr.n != 4, "read %d bytes past an oversize prefix, want 4", cr.n)
			err2 := r.ReadFrame(&f)
			if tt.sticky {
				require.True(t, err2 == err, "second read: got %v, want the same error %v", err2, err)
				return
			}
			require.NoError(t, err2, "second read: got %v, want the next good frame", err2)
			want := sampleFrames()["drain_marker"]
			frameEqual(t, &f, &want)
		})
	}
}

func TestReader_HugePrefixDoesNotAllocate(t *testing.T) {
	stream := []byte{0xff, 0xff, 0xff, 0xff} // 4 GiB announced, default limit
	// TotalAlloc is process-wide, so a single read can pick up another
	// goroutine's allocation; average over many reads instead. A reader that
	// allocated the announced (or even the limit's) body would add megabytes
	// per read.
	const reads = 200
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range reads {
		r := wire.NewReader(bytes.NewReader(stream), 0)
		_, err := r.ReadRaw()
		require.ErrorIs(t, err, wire.ErrFrameTooLarge)
	}
	runtime.ReadMemStats(&after)
	// Only the reader, the error and its message; never a body buffer.
	got := (after.TotalAlloc - before.TotalAlloc) / reads
	require.LessOrEqual(t, got, uint64(4096), "allocated %d bytes per read, want ≤ 4096", got)
}

type errWriter struct{ err error }

func (e errWriter) Write([]byte) (int, error) { return 0, e.err }

func TestWriter_PassesWriteErrors(t *testing.T) {
	boom := errors.New("boom")
	f := sampleFrames()["drain_marker"]
	require.Same(t, boom, wire.NewWriter(errWriter{boom}, 0).WriteFrame(&f))
}

func TestReader_PassesReadErrors(t *testing.T) {
	boom := errors.New("boom")
	r := wire.NewReader(iotest.ErrReader(boom), 0)
	_, err := r.ReadRaw()
	require.Same(t, boom, err)
}

func TestWriter_WriteSnapshotChunks(t *testing.T) {
	words := make([]uint64, 1000)
	for i := range words {
		words[i] = uint64(i) * 0x9E3779B97F4A7C15
	}
	s := &ckf.Snapshot{Identity: testIdentity(), Lease: testLease(), Sequence: 5, Words: words}
	limit := wire.MaxSnapshotChunkOverhead + 8*300 // 300 words a chunk → 4 chunks
	var buf bytes.Buffer
	require.NoError(t, wire.NewWriter(&buf, limit).WriteSnapshot(s))
	r := wire.NewReader(&buf, limit)
	var got []uint64
	var f wire.Frame
	for i := 0; ; i++ {
		err := r.ReadFrame(&f)
		if err == io.EOF {
			require.Equal(t, 4, i, "chunks: got %d, want 4", i)
			break
		}
		require.NoError(t, err)
		c := f.Snapshot
		require.Equal(t, uint32(i), c.ChunkIndex, "chunk %d: index", i)
		require.Equal(t, uint32(4), c.ChunkCount, "chunk %d: count", i)
		require.Equal(t, uint64(len(got)), c.BucketOffset, "chunk %d: offset", i)
		require.Equal(t, uint64(5), c.Sequence, "chunk %d: sequence", i)
		got = append(got, c.Words...)
	}
	require.Equal(t, words, got, "reassembled words differ from the snapshot")
}

func TestWriteRaw_ReadRaw(t *testing.T) {
	body := mustHex(goldenFrames["close"])
	var buf bytes.Buffer
	require.NoError(t, wire.NewWriter(&buf, 0).WriteRaw(body))
	{
		got := binary.BigEndian.Uint32(buf.Bytes())
		require.Equal(t, uint32(len(body)), got, "prefix: got %d, want %d", got, len(body))
	}
	got, err := wire.NewReader(&buf, 0).ReadRaw()
	require.NoError(t, err)
	require.Equal(t, body, got)
}
