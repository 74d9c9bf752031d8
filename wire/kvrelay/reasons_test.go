package kvrelay_test

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/cbi1"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// contractTable is the error table of grpc-contract.md @d95e45a5, written out
// again as reason suffix → gRPC code, independently of reasons.go.
var contractTable = map[string]codes.Code{
	"CONTRACT_MISMATCH":         codes.FailedPrecondition,
	"INVALID_REQUEST":           codes.InvalidArgument,
	"UNSUPPORTED_FEATURE":       codes.FailedPrecondition,
	"POOL_NOT_FOUND":            codes.NotFound,
	"PRODUCER_CHANGED":          codes.FailedPrecondition,
	"RESOURCE_LIMIT":            codes.ResourceExhausted,
	"SUBSCRIBER_LAGGED":         codes.ResourceExhausted,
	"SNAPSHOT_PROGRESS_TIMEOUT": codes.ResourceExhausted,
	"PUBLICATION_UNAVAILABLE":   codes.Unavailable,
	"INVALID_PUBLICATION":       codes.FailedPrecondition,
	"INTERNAL":                  codes.Internal,
}

func TestReasons_MatchContract(t *testing.T) {
	rs := kvrelay.Reasons()
	require.Len(t, rs, len(contractTable))
	require.Len(t, kvrelaypb.RelayErrorReason_name, len(contractTable)+1, "every enum value but UNSPECIFIED is in the table")
	for i, r := range rs {
		assert.Equal(t, kvrelaypb.RelayErrorReason(i+1), r.Reason, "ordered by number")
		suffix, ok := trimPrefix(r.Name(), "RELAY_ERROR_REASON_")
		require.True(t, ok, r.Name())
		assert.Equal(t, contractTable[suffix], r.Code, r.Name())
		assert.NotEmpty(t, r.Action)
		got, ok := kvrelay.LookupReason(r.Reason)
		require.True(t, ok)
		assert.Equal(t, r, got)
	}
	for _, r := range []kvrelaypb.RelayErrorReason{0, 12, -1} {
		_, ok := kvrelay.LookupReason(r)
		assert.False(t, ok, "%d", r)
	}
}

func trimPrefix(s, p string) (string, bool) {
	if len(s) < len(p) || s[:len(p)] != p {
		return s, false
	}
	return s[len(p):], true
}

func TestTrailerReason(t *testing.T) {
	const key = kvrelay.ErrorReasonTrailer
	cases := []struct {
		name string
		md   metadata.MD
		want kvrelaypb.RelayErrorReason
	}{
		{"absent", nil, 0},
		{"known", metadata.Pairs(key, "RELAY_ERROR_REASON_PRODUCER_CHANGED"), kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_PRODUCER_CHANGED},
		{"last reason", metadata.Pairs(key, "RELAY_ERROR_REASON_INTERNAL"), kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_INTERNAL},
		{"key is case-insensitive (gRPC lower-cases it)", metadata.Pairs("KV-Relay-Error-Reason", "RELAY_ERROR_REASON_POOL_NOT_FOUND"), kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_POOL_NOT_FOUND},
		{"unspecified", metadata.Pairs(key, "RELAY_ERROR_REASON_UNSPECIFIED"), 0},
		{"unknown name", metadata.Pairs(key, "RELAY_ERROR_REASON_SOMETHING_NEW"), 0},
		{"suffix only", metadata.Pairs(key, "PRODUCER_CHANGED"), 0},
		{"lower case value", metadata.Pairs(key, "relay_error_reason_producer_changed"), 0},
		{"number", metadata.Pairs(key, "5"), 0},
		{"two values", metadata.Pairs(key, "RELAY_ERROR_REASON_INTERNAL", key, "RELAY_ERROR_REASON_INTERNAL"), 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { assert.Equal(t, c.want, kvrelay.TrailerReason(c.md)) })
	}
}

func TestDisposition_FallsBackToCode(t *testing.T) {
	lagged := kvrelay.Disposition(status.Error(codes.ResourceExhausted, "x"),
		metadata.Pairs(kvrelay.ErrorReasonTrailer, "RELAY_ERROR_REASON_SUBSCRIBER_LAGGED"))
	assert.Equal(t, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_SUBSCRIBER_LAGGED, lagged.Reason)
	assert.True(t, lagged.Backoff)

	for code, want := range map[codes.Code]struct{ backoff, refresh bool }{
		codes.FailedPrecondition: {false, true},
		codes.ResourceExhausted:  {true, false},
		codes.Unavailable:        {true, false},
		codes.InvalidArgument:    {false, false},
		codes.Unauthenticated:    {true, true},
	} {
		d := kvrelay.Disposition(status.Error(code, "proxy"), nil)
		assert.Equal(t, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_UNSPECIFIED, d.Reason, "%v", code)
		assert.Equal(t, code, d.Code)
		assert.Equal(t, want.backoff, d.Backoff, "%v", code)
		assert.Equal(t, want.refresh, d.RefreshCatalog, "%v", code)
	}
}

// relayServer is a KvEventRelay whose RPCs fail the way the contract says,
// and whose SubscribeKvPool sends one full-size CBI1 snapshot chunk.
type relayServer struct {
	kvrelaypb.UnimplementedKvEventRelayServer
}

func (relayServer) GetRelayInfo(ctx context.Context, req *kvrelaypb.RelayInfoRequest) (*kvrelaypb.RelayInfo, error) {
	if err := kvrelay.CheckRequest(req); err != nil {
		return nil, kvrelay.Fail(ctx, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_CONTRACT_MISMATCH, "%v", err)
	}
	info := &kvrelaypb.RelayInfo{}
	kvrelay.StampResponse(info, &kvrelaypb.RelayIdentity{DrtInstanceId: 7, RelayIncarnation: 8})
	return info, nil
}

func (relayServer) SubscribeKvPool(req *kvrelaypb.SubscribeKvPoolRequest, stream grpc.ServerStreamingServer[kvrelaypb.FilterUpdate]) error {
	if err := kvrelay.CheckSubscriberID(req.GetSubscriberId()); err != nil {
		return kvrelay.Fail(stream.Context(), kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_INVALID_REQUEST, "%v", err)
	}
	words := make([]uint64, cbi1.MaxChunkBuckets)
	chunks, err := cbi1.EncodeSnapshot(ckf.NewFormat(ckf.DefaultSeed, uint64(len(words))), 1, 1, words)
	if err != nil {
		return err
	}
	u := &kvrelaypb.FilterUpdate{Kind: kvrelaypb.FilterUpdateKind_FILTER_UPDATE_KIND_SNAPSHOT_CHUNK, Sequence: 1, Payload: chunks[0]}
	kvrelay.StampResponse(u, &kvrelaypb.RelayIdentity{DrtInstanceId: 7, RelayIncarnation: 8})
	if err := stream.Send(u); err != nil {
		return err
	}
	return kvrelay.Fail(stream.Context(), kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_SUBSCRIBER_LAGGED, "lagged")
}

func dial(t *testing.T, opts ...grpc.DialOption) kvrelaypb.KvEventRelayClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	kvrelaypb.RegisterKvEventRelayServer(srv, relayServer{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	opts = append(opts,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	conn, err := grpc.NewClient("passthrough:///bufconn", opts...)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return kvrelaypb.NewKvEventRelayClient(conn)
}

// TestFail_OverGRPC sends reasons through a real gRPC server: the trailer
// arrives on unary and streaming RPCs, and the code is the table's.
func TestFail_OverGRPC(t *testing.T) {
	client := dial(t, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(kvrelay.MaxMessageBytes)))
	ctx := t.Context()

	var trailer metadata.MD
	_, err := client.GetRelayInfo(ctx, &kvrelaypb.RelayInfoRequest{}, grpc.Trailer(&trailer))
	require.Equal(t, codes.FailedPrecondition, status.Code(err))
	assert.Equal(t, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_CONTRACT_MISMATCH, kvrelay.TrailerReason(trailer))
	assert.False(t, kvrelay.Disposition(err, trailer).Backoff)

	req := &kvrelaypb.RelayInfoRequest{}
	kvrelay.StampRequest(req)
	info, err := client.GetRelayInfo(ctx, req)
	require.NoError(t, err)
	require.NoError(t, kvrelay.CheckResponse(info))
	assert.Equal(t, uint64(8), info.GetRelay().GetRelayIncarnation())

	bad := &kvrelaypb.SubscribeKvPoolRequest{}
	kvrelay.StampRequest(bad)
	stream, err := client.SubscribeKvPool(ctx, bad)
	require.NoError(t, err)
	_, err = stream.Recv()
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Equal(t, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_INVALID_REQUEST, kvrelay.TrailerReason(stream.Trailer()))

	sub := &kvrelaypb.SubscribeKvPoolRequest{SubscriberId: "router-1"}
	kvrelay.StampRequest(sub)
	stream, err = client.SubscribeKvPool(ctx, sub)
	require.NoError(t, err)
	u, err := stream.Recv()
	require.NoError(t, err, "a full CBI1 chunk fits MaxMessageBytes")
	require.NoError(t, kvrelay.CheckResponse(u))
	var f cbi1.Frame
	require.NoError(t, cbi1.Decode(u.GetPayload(), &f))
	assert.Len(t, f.Words, cbi1.MaxChunkBuckets)
	_, err = stream.Recv()
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Equal(t, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_SUBSCRIBER_LAGGED, kvrelay.TrailerReason(stream.Trailer()))
}

// TestMaxMessageBytes_DefaultClientRefusesAFullChunk shows why clients must
// raise gRPC's default 4 MiB receive limit.
func TestMaxMessageBytes_DefaultClientRefusesAFullChunk(t *testing.T) {
	client := dial(t)
	sub := &kvrelaypb.SubscribeKvPoolRequest{SubscriberId: "router-1"}
	kvrelay.StampRequest(sub)
	stream, err := client.SubscribeKvPool(t.Context(), sub)
	require.NoError(t, err)
	_, err = stream.Recv()
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Equal(t, kvrelaypb.RelayErrorReason_RELAY_ERROR_REASON_UNSPECIFIED, kvrelay.TrailerReason(stream.Trailer()), "the client's own limit, not the relay's reason")
}

// TestFail_UnknownReason: a programming error becomes INTERNAL, never a
// status without a reason.
func TestFail_UnknownReason(t *testing.T) {
	err := kvrelay.Fail(context.Background(), 0, "oops")
	assert.Equal(t, codes.Internal, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "oops")
}
