package replica

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/internal/testing/natstest"
)

// answeringJS is a real JetStream context whose first publishes get the
// answers a replicated stream gives during an election, in order; later
// publishes go to the server as they are. An answer's publish func decides
// whether the message reaches the server first (an ack lost on the way
// back) or not (refused before the proposal).
type answeringJS struct {
	jetstream.JetStream
	answers []func(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
	calls   atomic.Int32
}

func (j *answeringJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	i := int(j.calls.Add(1)) - 1
	if i < len(j.answers) {
		return j.answers[i](ctx, msg, opts...)
	}
	return j.JetStream.PublishMsg(ctx, msg, opts...)
}

// inProcess is nats-server's answer to an expected-sequence publish while
// a message on the subject is still being proposed (v2.15.2
// server/jetstream_batching.go checkMsgHeadersPreClusteredProposal).
func inProcess(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return nil, &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant, Description: "wrong last sequence"}
}

// TestAppend_InProcessAnswerIsRetriedNotARefusal: the 10164 answer a
// replicated stream gives while a message on the subject is in process —
// a rival's or this append's own earlier attempt — is not a refusal while
// the subject has not moved: the append retries the same message id and
// is stored once. Treating it as a refusal made a healthy leader step down
// and rebuild whenever NATS re-elected a stream leader.
func TestAppend_InProcessAnswerIsRetriedNotARefusal(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := EnsureStream(ctx, js, StreamConfig{Replicas: 1})
	require.NoError(t, err)
	cmds := []Command{{Kind: KindReset, SourceEpoch: 1, Member: ckf.Member{WorkerID: 1}}}

	t.Run("a rival in process", func(t *testing.T) {
		subject, _ := Subject("", "rival")
		fj := &answeringJS{JetStream: js, answers: []func(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error){inProcess, inProcess}}
		app := NewAppender(fj, s, subject, 3, 0, 0)
		require.NoError(t, app.Term(ctx, TermRecord{Node: "n"}), "a transient in-process answer deposed the leader")
		tail, err := Tail(ctx, s, subject)
		require.NoError(t, err)
		require.Equal(t, tail, app.Last())
		require.Equal(t, int32(3), fj.calls.Load())
	})

	// The earlier attempt was stored and its ack lost; the retry is told
	// "in process" and then finds it in the tail: one copy, no refusal.
	t.Run("its own earlier attempt stored", func(t *testing.T) {
		subject, _ := Subject("", "own")
		app := NewAppender(js, s, subject, 3, 0, 0)
		require.NoError(t, app.Term(ctx, TermRecord{Node: "n"}))
		stored := func(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
			_, err := js.PublishMsg(ctx, msg, opts...)
			require.NoError(t, err)
			return nil, nats.ErrTimeout // the ack was lost
		}
		fj := &answeringJS{JetStream: js, answers: []func(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error){stored, inProcess}}
		app = NewAppender(fj, s, subject, 3, app.Last(), 0)
		before := app.Last()
		require.NoError(t, app.Append(ctx, 0, cmds))
		tail, err := Tail(ctx, s, subject)
		require.NoError(t, err)
		require.Equal(t, tail, app.Last())
		require.Equal(t, before+1, tail, "the batch was stored more than once")
	})

	t.Run("a rival that landed is a refusal", func(t *testing.T) {
		subject, _ := Subject("", "landed")
		app := NewAppender(js, s, subject, 3, 0, 0)
		require.NoError(t, app.Term(ctx, TermRecord{Node: "n"}))
		rival := NewAppender(js, s, subject, 4, app.Last(), 0)
		landed := func(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
			require.NoError(t, rival.Term(ctx, TermRecord{Node: "rival"}))
			return inProcess(ctx, msg, opts...)
		}
		fj := &answeringJS{JetStream: js, answers: []func(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error){landed}}
		app = NewAppender(fj, s, subject, 3, app.Last(), 0)
		require.ErrorIs(t, app.Append(ctx, 0, cmds), ErrRefused)
	})
}

// TestEnsureStream_KeepsAnOperatorsSettings: a replica's start does not
// rewrite the records stream an operator hardened — a byte cap and
// DenyPurge stay (every start used to reset the cap, and with DenyPurge no
// replica could start: NATS refuses to lift it) — and a stream whose
// settings would lose records is refused, naming the setting.
func TestEnsureStream_KeepsAnOperatorsSettings(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx := t.Context()
	s, err := EnsureStream(ctx, js, StreamConfig{Replicas: 1})
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	cfg.MaxBytes, cfg.DenyPurge = 50<<20, true
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)

	s, err = EnsureStream(ctx, js, StreamConfig{Replicas: 1})
	require.NoError(t, err, "a replica could not start on a hardened stream")
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(50<<20), info.Config.MaxBytes, "the operator's cap was overwritten")
	require.True(t, info.Config.DenyPurge)

	other := StreamConfig{Name: "AGED", SubjectPrefix: "aged", Replicas: 1}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "AGED", Subjects: []string{"aged.>"}, MaxAge: time.Hour})
	require.NoError(t, err)
	_, err = EnsureStream(ctx, js, other)
	require.ErrorIs(t, err, ErrStreamConfig)
	require.Contains(t, err.Error(), "max age")
}

// TestAppend_ForeignMessageUnderItsIDIsNotAStore: the stream deduplicates
// message ids across all its subjects. A message published first, on
// another subject, under the id an append will use is answered to the
// append as a "duplicate": that is not a store (the leader answered 202
// for a batch no replica ever had — red-team HA F00). Ids carry a random
// nonce per appender, and a duplicate answer is checked against the
// message it names.
func TestAppend_ForeignMessageUnderItsIDIsNotAStore(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{})
	_, js := srv.JetStream(t)
	ctx := t.Context()
	s, err := EnsureStream(ctx, js, StreamConfig{Replicas: 1})
	require.NoError(t, err)
	subject, _ := Subject("", "victim")
	app := NewAppender(js, s, subject, 3, 0, 0)
	require.NoError(t, app.Term(ctx, TermRecord{Node: "n"}))
	last := app.Last()

	// Someone who read the stream knows the scheme; here the test knows
	// the nonce too, the worst case.
	id := subject + ".b3." + app.nonce + ".0.0"
	_, err = js.PublishMsg(ctx, &nats.Msg{Subject: DefaultSubjectPrefix + ".zzz", Data: []byte("x"), Header: nats.Header{jetstream.MsgIDHeader: []string{id}}})
	require.NoError(t, err)
	err = app.Append(ctx, 0, []Command{{Kind: KindReset, SourceEpoch: 1, Member: ckf.Member{WorkerID: 1}}})
	require.ErrorIs(t, err, ErrForeignDuplicate)
	tail, err := Tail(ctx, s, subject)
	require.NoError(t, err)
	require.Equal(t, last, tail, "nothing was stored on the pool's subject")

	// Without the nonce an id is guessable from term and position alone.
	other := NewAppender(js, s, subject, 3, 0, 0)
	require.NotEqual(t, app.nonce, other.nonce)
}
