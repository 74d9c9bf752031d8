package demo

import (
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDemo_OverNATS runs the demo with the router reading the relay's
// JetStream broadcast through an embedded nats-server.
func TestDemo_OverNATS(t *testing.T) {
	rep, out := runDemoReport(t, "--transport", "nats", "--duration", "1s", "--consumer", "native", "--rate", "1000", "--probes", "20000")
	checkSummary(t, rep, out, 3)
	assert.Contains(t, out, "router over nats")
	assert.Positive(t, rep.Agree, "the router answered over NATS")
}

func TestDemo_TransportFlag(t *testing.T) {
	for _, tr := range []string{"http", "nats", "grpc"} {
		o, err := parseDemo([]string{"--transport", tr}, io.Discard)
		require.NoError(t, err, tr)
		assert.Equal(t, tr, o.transport)
	}
	_, err := parseDemo([]string{"--transport", "carrier-pigeon"}, io.Discard)
	require.ErrorIs(t, err, ErrUsage)
	o, err := parseDemo(nil, io.Discard)
	require.NoError(t, err)
	assert.True(t, strings.EqualFold(o.transport, "http"))
}
