// Package jsexpect reads JetStream's answers to a publish that expects its
// subject's last sequence (Nats-Expected-Last-Subject-Sequence): the fenced
// appends of a replicated pool's records (internal/replica) and of the
// fan-out (internal/natspub) decide by them whether another writer moved
// the subject or the answer is only transient. One classifier, so the two
// cannot drift on what nats-server's codes mean.
package jsexpect

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// Answer is what a publish error says about its expectation.
type Answer uint8

// Answers.
const (
	// Other: the error is not about the expectation (a timeout, no stream
	// leader, a duplicate still in process, anything else).
	Other Answer = iota
	// Refused (10071, "wrong last sequence"): the subject's last message
	// is not the one expected — another writer's message, or this
	// writer's earlier attempt that was stored (a standalone server checks
	// the expectation before the message id). Read the tail to tell.
	Refused
	// InProcess (10164, "wrong last sequence (constant)"): a message on the
	// subject is still in process on a replicated stream's leader, this
	// writer's own retried attempt or a rival's (nats-server v2.15.2
	// server/jetstream_batching.go checkMsgHeadersPreClusteredProposal:
	// expectedPerSubjectInProcess, inflight). Not a verdict: retry with
	// the same message id and expectation, or read the tail.
	InProcess
)

// Classify returns what err says about the publish's expectation.
func Classify(err error) Answer {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return Other
	}
	switch apiErr.ErrorCode {
	case jetstream.JSErrCodeStreamWrongLastSequence:
		return Refused
	case jetstream.JSErrCodeStreamWrongLastSequenceConstant:
		return InProcess
	}
	return Other
}

// Expectation reports whether a is Refused or InProcess: the subject's
// last message is to be read before anything is concluded.
func (a Answer) Expectation() bool { return a != Other }

// Tail is a subject's last message: its stream sequence (0: the subject
// has none) and its Nats-Msg-Id.
type Tail struct {
	Seq uint64
	ID  string
}

// ReadTail reads subject's last message in s.
func ReadTail(ctx context.Context, s jetstream.Stream, subject string) (Tail, error) {
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Tail{}, nil
	}
	if err != nil {
		return Tail{}, err
	}
	return Tail{Seq: m.Sequence, ID: m.Header.Get(jetstream.MsgIDHeader)}, nil
}

// Stored reports whether t shows the message with id stored after stream
// sequence last: a retry answered by a refusal (or a transient answer)
// whose earlier attempt is in fact the subject's last message.
func (t Tail) Stored(id string, last uint64) bool { return t.Seq > last && t.ID == id }
