package demo

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"

	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// grpcCounts counts what the router received over gRPC: SubscribeKvPool
// streams opened and FilterUpdate messages read from them, so the summary
// (and the demo's test) can show the lanes followed the gRPC contract.
type grpcCounts struct {
	streams atomic.Uint64
	updates atomic.Uint64
}

// demoGRPC is the router's gRPC options for the demo relay: the
// client's own dialing (plaintext on loopback) with a stream interceptor
// that counts the pool subscriptions and their messages into c.
func demoGRPC(c *grpcCounts) *client.GRPCConfig {
	count := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != kvrelaypb.KvEventRelay_SubscribeKvPool_FullMethodName {
			return cs, err
		}
		c.streams.Add(1)
		return countingStream{ClientStream: cs, n: &c.updates}, nil
	}
	return &client.GRPCConfig{DialOptions: []grpc.DialOption{grpc.WithStreamInterceptor(count)},
		SubscriberID: "ckfrelay-demo-router"}
}

// countingStream counts the messages received on a pool subscription.
type countingStream struct {
	grpc.ClientStream
	n *atomic.Uint64
}

func (s countingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.n.Add(1)
	}
	return err
}
