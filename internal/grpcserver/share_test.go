package grpcserver

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// A gRPC pool stream is charged to its peer's address, like an HTTP stream:
// one address holds max_subscribers_per_client of a pool's slots, and
// another address's router still subscribes.
func TestSubscribeKvPool_ClientShare(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSubscribers = 4 // a share of 1
	r := startRelay(t, cfg)
	id := producerToWire(r.pool(t, "dc-a").Identity())
	subscribe := func(c kvrelaypb.KvEventRelayClient) (codes.Code, kvrelaypb.RelayErrorReason) {
		st, err := c.SubscribeKvPool(t.Context(), subscribeReq(id))
		require.NoError(t, err)
		_, err = st.Recv()
		if err == nil {
			return codes.OK, 0
		}
		return reason(err, st.Trailer())
	}
	code, _ := subscribe(r.client) // from 127.0.0.1
	require.Equal(t, codes.OK, code)
	code, why := subscribe(r.client)
	assert.Equal(t, codes.ResourceExhausted, code, "the address's share is taken")
	assert.Equal(t, reasonLimit, why)

	conn, err := grpc.NewClient(r.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
			return d.DialContext(ctx, "tcp", addr)
		}))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	code, _ = subscribe(kvrelaypb.NewKvEventRelayClient(conn))
	assert.Equal(t, codes.OK, code, "another address's router subscribes")
}
