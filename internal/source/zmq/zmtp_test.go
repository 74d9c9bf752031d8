package zmq

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func frame(flags byte, body []byte) []byte {
	if len(body) > 255 {
		return append(binary.BigEndian.AppendUint64([]byte{flags | flagLong}, uint64(len(body))), body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

func readyBody(props ...string) []byte {
	b := append([]byte{5}, "READY"...)
	for i := 0; i+1 < len(props); i += 2 {
		b = append(b, byte(len(props[i])))
		b = append(b, props[i]...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(props[i+1])))
		b = append(b, props[i+1]...)
	}
	return b
}

// trackWhole is the reference: the frames of b parsed in one pass; it
// returns how many bytes may be delivered and whether b was refused.
func trackWhole(b []byte, lim frameLimits) (int, bool) {
	var msg uint64
	frames := 0
	for i := 0; i < len(b); {
		fl := b[i]
		if fl&flagReserved != 0 {
			return i, true
		}
		hl := 2
		if fl&flagLong != 0 {
			hl = 9
		}
		if i+hl > len(b) {
			return len(b), false
		}
		var size uint64
		if hl == 2 {
			size = uint64(b[i+1])
		} else {
			size = binary.BigEndian.Uint64(b[i+1 : i+9])
		}
		cmd := fl&flagCommand != 0
		if cmd && frames > 0 {
			return i + hl - 1, true
		}
		frames++
		msg += size
		if size > lim.MaxMessage || msg > lim.MaxMessage || frames > lim.MaxFrames {
			return i + hl - 1, true
		}
		if fl&flagMore == 0 || cmd {
			msg, frames = 0, 0
		}
		i += hl
		if uint64(len(b)-i) < size {
			return len(b), false
		}
		i += int(size)
	}
	return len(b), false
}

// track feeds b to a tracker in chunks of the given sizes.
func track(b []byte, lim frameLimits, chunks []int) (int, error) {
	t := frameTracker{lim: lim}
	done := 0
	for ci := 0; done < len(b); ci++ {
		n := len(b) - done
		if ci < len(chunks) && chunks[ci] > 0 && chunks[ci] < n {
			n = chunks[ci]
		}
		k, err := t.scan(b[done : done+n])
		done += k
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

func TestFrameTracker_RefusesBeforeTheLastHeaderByte(t *testing.T) {
	lim := frameLimits{MaxMessage: 1000, MaxFrames: 3}
	ok := append(frame(flagMore, []byte("topic")), frame(flagMore, make([]byte, 8))...)
	ok = append(ok, frame(0, make([]byte, 900))...)
	for _, c := range []struct {
		name    string
		b       []byte
		refused bool
		at      int
	}{
		{"three frames within the limit", ok, false, len(ok)},
		{"a frame of 2^40 bytes", binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<40), true, 8},
		{"a command of 2^62 bytes", binary.BigEndian.AppendUint64([]byte{flagLong | flagCommand}, 1<<62), true, 8},
		{"a message above the limit in two frames", append(frame(flagMore, make([]byte, 600)), binary.BigEndian.AppendUint64([]byte{flagLong}, 401)...), true, 609 + 8},
		{"four frames", append(append([]byte{}, ok[:len(ok)-909]...), append(frame(flagMore, nil), frame(flagMore, nil)...)...), true, 7 + 10 + 2 + 1},
		{"reserved flag bits", []byte{0x80, 0}, true, 0},
		{"a command inside a message", append(frame(flagMore, nil), frame(flagCommand, nil)...), true, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, chunks := range [][]int{nil, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, {3, 5, 7}} {
				n, err := track(c.b, lim, chunks)
				if !c.refused {
					require.NoError(t, err)
					assert.Equal(t, c.at, n)
					continue
				}
				require.ErrorIs(t, err, ErrPeerRefused)
				assert.Equal(t, c.at, n, "bytes delivered before the refusal")
			}
		})
	}
}

func TestCheckReady(t *testing.T) {
	require.NoError(t, checkReady(readyBody("Socket-Type", "PUB"), zmq4.Sub))
	require.NoError(t, checkReady(readyBody("Identity", "x", "socket-type", "XPUB"), zmq4.Sub))
	require.NoError(t, checkReady(readyBody("Socket-Type", "ROUTER"), zmq4.Dealer))
	for name, b := range map[string][]byte{
		"empty":              nil,
		"name overruns":      {9, 'R'},
		"not READY":          append([]byte{5}, "ERROR"...),
		"no socket type":     readyBody("Identity", "x"),
		"incompatible":       readyBody("Socket-Type", "PUSH"),
		"value overruns":     append(readyBody(), append([]byte{1, 'a'}, 0, 0, 0, 9, 'x')...),
		"key overruns":       append(readyBody(), 200, 'a'),
		"zero-length key":    append(readyBody(), 0, 0, 0, 0, 0),
		"truncated property": append(readyBody(), 1, 'a', 0, 0),
	} {
		err := checkReady(b, zmq4.Sub)
		require.ErrorIs(t, err, ErrPeerRefused, name)
	}
}

func TestCheckGreeting(t *testing.T) {
	require.NoError(t, checkGreeting(ourGreeting[:]))
	bad := func(f func(g []byte)) []byte {
		g := ourGreeting
		f(g[:])
		return g[:]
	}
	for name, g := range map[string][]byte{
		"short":     ourGreeting[:63],
		"signature": bad(func(g []byte) { g[0] = 0 }),
		"footer":    bad(func(g []byte) { g[9] = 0 }),
		"ZMTP 2":    bad(func(g []byte) { g[10] = 2 }),
		"CURVE":     bad(func(g []byte) { copy(g[12:32], "CURVE") }),
		"as-server": bad(func(g []byte) { g[32] = 7 }),
	} {
		require.ErrorIs(t, checkGreeting(g), ErrPeerRefused, name)
	}
}

// FuzzFrameTracker checks the tracker, fed in arbitrary chunks, against the
// one-pass reference: the same bytes delivered, the same refusal, and never
// a header above the limit delivered whole.
func FuzzFrameTracker(f *testing.F) {
	f.Add(frame(flagMore, []byte("t")), []byte{1, 2})
	f.Add(binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<40), []byte{3})
	f.Add(append(frame(flagMore, make([]byte, 300)), frame(0, make([]byte, 300))...), []byte{9, 1, 200})
	f.Fuzz(func(t *testing.T, b []byte, chunkBytes []byte) {
		lim := frameLimits{MaxMessage: 512, MaxFrames: 4}
		chunks := make([]int, len(chunkBytes))
		for i, c := range chunkBytes {
			chunks[i] = int(c)
		}
		n, err := track(b, lim, chunks)
		wantN, wantRefused := trackWhole(b, lim)
		require.Equal(t, wantRefused, err != nil, "refusal")
		require.Equal(t, wantN, n, "bytes delivered")
		if err != nil {
			require.True(t, errors.Is(err, ErrPeerRefused))
		}
	})
}

// FuzzHandshake feeds arbitrary greetings and READY bodies to the checks:
// they never panic, and a body they accept is one zmq4's own metadata
// parser (which indexes past short input) reads without panicking.
func FuzzHandshake(f *testing.F) {
	f.Add(ourGreeting[:], readyBody("Socket-Type", "PUB"))
	f.Add(ourGreeting[:], []byte{5, 'R', 'E', 'A', 'D', 'Y', 1})
	f.Fuzz(func(t *testing.T, g, cmd []byte) {
		_ = checkGreeting(g)
		if checkReady(cmd, zmq4.Sub) != nil {
			return
		}
		md := zmq4.Metadata{}
		require.NoError(t, md.UnmarshalZMTP(cmd[1+int(cmd[0]):]))
	})
}
