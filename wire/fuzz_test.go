package wire_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire"
)

// Every decoder error must be one of the documented categories.
func checkDecodeErr(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	var de *wire.DecodeError
	require.ErrorAs(t, err, &de)
	for _, k := range []error{wire.ErrTruncated, wire.ErrTrailingBytes, wire.ErrFrameTooLarge, wire.ErrUnknownVersion, wire.ErrUnknownKind, wire.ErrMalformed, wire.ErrLimitExceeded} {
		if errors.Is(err, k) {
			return
		}
	}
	require.Fail(t, fmt.Sprintf("error %v wraps no decode category", err))
}

// checkLimited checks a limited batch decode against the unlimited one:
// limits that the batch fits give the same result; a batch beyond them is
// refused (with ErrLimitExceeded, or with the error the whole input has).
func checkLimited(t *testing.T, all []ckf.RouterEvent, allErr error, decode func(wire.BatchLimits) ([]ckf.RouterEvent, error)) {
	t.Helper()
	fits := wire.BatchLimits{MaxEvents: max(len(all), 1), MaxBlocksPerEvent: 1}
	for i := range all {
		fits.MaxBlocksPerEvent = max(fits.MaxBlocksPerEvent, all[i].BlockCount())
	}
	got, err := decode(fits)
	checkDecodeErr(t, err)
	if allErr == nil {
		// The JSON decoder also counts arrays in unknown fields, so a fitting
		// batch may still exceed the limit there; nothing else may differ.
		require.False(t, err != nil && !errors.Is(err, wire.ErrLimitExceeded), "limits the batch fits: %v", err)
		require.False(t, err == nil && !deepEqual(normalizeAll(got), normalizeAll(all)), "limited decode differs:\ngot  %+v\nwant %+v", got, all)
	} else {
		require.Error(t, err, "limited decode accepted what the unlimited one refused (%v)", allErr)
	}
	if len(all) > 1 {
		_, err := decode(wire.BatchLimits{MaxEvents: len(all) - 1})
		require.ErrorIs(t, err, wire.ErrLimitExceeded, "%d events under a limit of %d", len(all), len(all)-1)
	}
}

func normalizeAll(evs []ckf.RouterEvent) []ckf.RouterEvent {
	out := make([]ckf.RouterEvent, len(evs))
	for i := range evs {
		out[i] = normalize(evs[i])
	}
	return out
}

func FuzzDecodeFrame(f *testing.F) {
	for _, name := range []string{"snapshot_chunk", "delta", "drain_marker", "heartbeat", "close"} {
		f.Add(mustHex(goldenFrames[name]))
	}
	f.Add([]byte{})
	f.Add(mustHex("940103932a0509cf0000"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var fr wire.Frame
		before := fr
		err := wire.DecodeFrame(data, &fr)
		checkDecodeErr(t, err)
		if err != nil {
			require.Equal(t, before, fr, "frame changed on error")
			return
		}
		// Whatever decodes re-encodes and decodes to the same frame.
		b, err := wire.AppendFrame(nil, &fr)
		require.NoError(t, err, "decoded frame does not re-encode")
		var again wire.Frame
		require.NoError(t, wire.DecodeFrame(b, &again), "re-decode")
		require.True(t, sameFrame(&again, &fr), "re-decode:\ngot  %+v\nwant %+v", again, fr)
		require.LessOrEqual(t, len(b), len(data), "canonical encoding %d bytes longer than input %d", len(b), len(data))
	})
}

func FuzzReader(f *testing.F) {
	f.Add(mustHex("00000008"+goldenFrames["drain_marker"]+"00000015"+goldenFrames["close"]), 0)
	f.Add(mustHex("ffffffff"), 16)
	f.Add(mustHex("0000000000000002"), 8)
	f.Fuzz(func(t *testing.T, data []byte, limit int) {
		limit = 1 + int(uint(limit)%4096) // keep buffers small
		r := wire.NewReader(bytes.NewReader(data), limit)
		var fr wire.Frame
		for range len(data) + 1 {
			err := r.ReadFrame(&fr)
			if err == io.EOF {
				return
			}
			checkDecodeErr(t, err)
			if errors.Is(err, wire.ErrTruncated) || errors.Is(err, wire.ErrFrameTooLarge) {
				return // sticky
			}
		}
		require.Fail(t, fmt.Sprintf("reader did not reach the end of %d bytes", len(data)))
	})
}

func FuzzDecodeRouterEventJSON(f *testing.F) {
	for _, ev := range sampleEvents() {
		b, _ := wire.AppendRouterEventJSON(nil, &ev)
		f.Add(b)
	}
	f.Add([]byte(`{"worker_id":1,"event":{"event_id":2,"data":{"cleared":null}}}`))
	f.Add([]byte(`[{"worker_id":1}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := wire.DecodeRouterEventJSON(data)
		checkDecodeErr(t, err)
		if err == nil {
			b, err := wire.AppendRouterEventJSON(nil, &ev)
			require.NoError(t, err, "decoded event does not re-encode")
			again, err := wire.DecodeRouterEventJSON(b)
			require.NoError(t, err, "re-decode")
			require.Equal(t, normalize(ev), normalize(again), "re-decode")
		}
		all, err := wire.DecodeRouterEventsJSON(data, nil)
		checkDecodeErr(t, err)
		checkLimited(t, all, err, func(lim wire.BatchLimits) ([]ckf.RouterEvent, error) {
			return wire.DecodeRouterEventsJSONLimited(data, nil, lim)
		})
	})
}

func FuzzDecodeRouterEventMsgpack(f *testing.F) {
	for _, ev := range sampleEvents() {
		b, _ := wire.AppendRouterEventMsgpack(nil, &ev)
		f.Add(b)
	}
	f.Add([]byte{0x91, 0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := wire.DecodeRouterEventMsgpack(data)
		checkDecodeErr(t, err)
		if err == nil {
			b, err := wire.AppendRouterEventMsgpack(nil, &ev)
			require.NoError(t, err, "decoded event does not re-encode")
			again, err := wire.DecodeRouterEventMsgpack(b)
			require.NoError(t, err, "re-decode")
			require.Equal(t, normalize(ev), normalize(again), "re-decode")
		}
		all, err := wire.DecodeRouterEventsMsgpack(data, nil)
		checkDecodeErr(t, err)
		checkLimited(t, all, err, func(lim wire.BatchLimits) ([]ckf.RouterEvent, error) {
			return wire.DecodeRouterEventsMsgpackLimited(data, nil, lim)
		})
	})
}
