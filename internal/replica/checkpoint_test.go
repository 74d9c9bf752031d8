package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/producer"
)

// sampleCheckpoint returns a checkpoint of a real pool with members, idle
// records, a capacity omission (a 2-bucket table) and a pending window.
func sampleCheckpoint(t testing.TB) *Checkpoint {
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = 1
	cfg.PublishEveryNEvents = 1000 // the window stays open
	pool, err := ckf.NewPool(cfg)
	require.NoError(t, err)
	pcfg := producer.DefaultConfig()
	// The sparse-tail flush (1 ms by default) would close the window
	// before the export on a slow or loaded machine (seen under -race).
	pcfg.PublicationDelay = time.Hour
	h, faults, err := producer.Start(pool, producer.Scope{ProducerIncarnation: 1}, pcfg)
	require.NoError(t, err)
	go func() {
		for range faults {
		}
	}()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = h.Shutdown(ctx)
	}()
	ctx := context.Background()
	for w := uint64(1); w <= 3; w++ {
		var evs []ckf.RouterEvent
		for i := uint64(0); i < 5; i++ {
			evs = append(evs, ckf.RouterEvent{WorkerID: w, DPRank: uint32(w), EventID: i, Kind: ckf.EventStored,
				Blocks: []ckf.StoredBlock{{BlockHash: 100*w + i, TokensHash: 7000 + 13*w + i}}})
		}
		require.NoError(t, h.AdmitEvents(ctx, w, evs))
	}
	require.NoError(t, h.AdmitEvents(ctx, 9, []ckf.RouterEvent{{WorkerID: 9, Kind: ckf.EventCleared}}))
	img, err := h.ExportImage(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, img.Pool.NonResident, "the sample has no capacity omission")
	require.NotEmpty(t, img.Pool.Window, "the sample has no open window")
	return &Checkpoint{Seq: 41, Term: 7, Leader: TermRecord{Node: "a", Address: "http://a:8080"},
		Cursors: []producer.Cursor{{Source: "tcp://engine-0:5557", Seq: 99}, {Source: "dynamo/kv_events", Seq: 3}}, Image: img}
}

// TestCheckpointRoundTrip: a checkpoint decodes to itself; every strict
// prefix, every flipped byte and a wrong version are refused as damage.
func TestCheckpointRoundTrip(t *testing.T) {
	c := sampleCheckpoint(t)
	b := AppendCheckpoint(nil, c)
	got, err := DecodeCheckpoint(b)
	require.NoError(t, err)
	require.Equal(t, c, got)
	t.Logf("checkpoint of a 2-bucket pool with %d members: %d bytes", len(c.Image.Pool.Members), len(b))

	for n := range len(b) {
		_, err := DecodeCheckpoint(b[:n])
		require.ErrorIs(t, err, ErrDamagedCheckpoint, "prefix of %d bytes", n)
	}
	for i := range b {
		d := bytes.Clone(b)
		d[i] ^= 0x41
		_, err := DecodeCheckpoint(d)
		require.ErrorIs(t, err, ErrDamagedCheckpoint, "byte %d flipped", i)
	}
	// A body that is well framed and checksummed but wrong inside is
	// still refused: trailing bytes, and a word count that is not the
	// format's bucket count.
	resum := func(body []byte) []byte {
		return binary.LittleEndian.AppendUint32(body, crc32.Checksum(body, castagnoli))
	}
	_, err = DecodeCheckpoint(resum(append(bytes.Clone(b[:len(b)-4]), 0)))
	require.ErrorIs(t, err, ErrDamagedCheckpoint)
	_, err = DecodeCheckpoint(resum([]byte{'K', 'C', 2}))
	require.ErrorIs(t, err, ErrDamagedCheckpoint)
	short := *c
	short.Image.Pool.Words = short.Image.Pool.Words[:1]
	_, err = DecodeCheckpoint(AppendCheckpoint(nil, &short))
	require.ErrorIs(t, err, ErrDamagedCheckpoint)
}

// FuzzDecodeCheckpoint fuzzes the body behind a valid checksum (a random
// input almost never passes the CRC, and the body's decoder is what must
// hold): no input panics or allocates beyond a small multiple of its size,
// and whatever decodes re-encodes to a checkpoint that decodes the same.
func FuzzDecodeCheckpoint(f *testing.F) {
	b := AppendCheckpoint(nil, sampleCheckpoint(f))
	f.Add(b[:len(b)-4])
	f.Add([]byte{'K', 'C', 1})
	f.Fuzz(func(t *testing.T, body []byte) {
		b := binary.LittleEndian.AppendUint32(bytes.Clone(body), crc32.Checksum(body, castagnoli))
		c, err := DecodeCheckpoint(b)
		if err != nil {
			require.ErrorIs(t, err, ErrDamagedCheckpoint)
			return
		}
		again, err := DecodeCheckpoint(AppendCheckpoint(nil, c))
		require.NoError(t, err)
		require.Equal(t, c, again)
	})
}

// BenchmarkCheckpoint measures a checkpoint of a pool of 2^19 expected
// blocks filled to them (16 members, 64-block chains): taking the image,
// encoding it, decoding it and starting an actor from it, and its size.
func BenchmarkCheckpoint(b *testing.B) {
	cfg := ckf.DefaultConfig()
	cfg.ExpectedBlocks = 1 << 19
	pool, err := ckf.NewPool(cfg)
	require.NoError(b, err)
	for i := range uint64(cfg.ExpectedBlocks / 64) {
		ev := ckf.RouterEvent{WorkerID: i % 16, EventID: i, Kind: ckf.EventStored}
		for j := range uint64(64) {
			h := i<<8 | j
			ev.Blocks = append(ev.Blocks, ckf.StoredBlock{BlockHash: h, TokensHash: h * 0x9E3779B97F4A7C15})
		}
		pool.ApplyEvent(&ev)
	}
	var img ckf.PoolImage
	b.Run("image", func(b *testing.B) { // on the actor
		for b.Loop() {
			img = pool.Image()
		}
	})
	b.Run("sort", func(b *testing.B) { // the caller's
		for b.Loop() {
			img.SortLineages()
		}
	})
	c := &Checkpoint{Seq: 1, Term: 1, Image: producer.Image{Pool: img}}
	var enc []byte
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			enc = AppendCheckpoint(enc[:0], c)
		}
		b.ReportMetric(float64(len(enc)), "bytes")
		b.ReportMetric(float64(len(img.Words)), "buckets")
	})
	b.Run("decode", func(b *testing.B) {
		for b.Loop() {
			if _, err := DecodeCheckpoint(enc); err != nil {
				require.Fail(b, "decode", "%v", err)
			}
		}
	})
	b.Run("restore", func(b *testing.B) {
		for b.Loop() {
			if _, err := ckf.RestorePool(cfg, &img); err != nil {
				require.Fail(b, "restore", "%v", err)
			}
		}
	})
}
