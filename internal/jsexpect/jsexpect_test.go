package jsexpect

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want Answer
	}{
		{"nil", nil, Other},
		{"refused", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}, Refused},
		{"wrapped refused", fmt.Errorf("append: %w", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}), Refused},
		{"in process", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant}, InProcess},
		{"no leader", &jetstream.APIError{Code: 503}, Other},
		{"timeout", nats.ErrTimeout, Other},
		{"plain", errors.New("x"), Other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Classify(tc.err)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.want != Other, got.Expectation())
		})
	}
}

// TestClassify_RealRefusal: a real nats-server's refusal of a stale
// expectation is Refused, and the tail shows who is last.
func TestClassify_RealRefusal(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx := t.Context()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Duplicates: time.Minute})
	require.NoError(t, err)
	tail, err := ReadTail(ctx, s, "s.a")
	require.NoError(t, err)
	assert.Equal(t, Tail{}, tail)
	_, err = js.PublishMsg(ctx, &nats.Msg{Subject: "s.a"}, jetstream.WithMsgID("one"), jetstream.WithExpectLastSequencePerSubject(0))
	require.NoError(t, err)
	_, err = js.PublishMsg(ctx, &nats.Msg{Subject: "s.a"}, jetstream.WithMsgID("two"), jetstream.WithExpectLastSequencePerSubject(0))
	assert.Equal(t, Refused, Classify(err), "%v", err)
	tail, err = ReadTail(ctx, s, "s.a")
	require.NoError(t, err)
	assert.Equal(t, Tail{Seq: 1, ID: "one"}, tail)
	assert.True(t, tail.Stored("one", 0))
	assert.False(t, tail.Stored("two", 0))
	assert.False(t, tail.Stored("one", 1))
}
