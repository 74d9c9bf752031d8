package demo

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDemo_OverGRPC runs the demo with the relay also serving Dynamo's
// dynamo.kvrelay.v1 contract and the router following it over gRPC (catalog,
// CBI1 snapshots and deltas), beside the same run over HTTP: both score
// against the fleet's exact truth, and the gRPC run's best-DC agreement is
// the HTTP run's: the disagreements are requests whose blocks were
// still in flight, a few per thousand either way, so the two runs (whose wall
// clocks differ) agree within 2 percentage points. The summary's gRPC counts show the lanes' frames came
// over SubscribeKvPool: a stream per lane, and more updates than streams
// (snapshot chunks, then deltas).
func TestDemo_OverGRPC(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo twice for a second")
	}
	args := []string{"--duration", "1s", "--consumer", "native", "--rate", "1000", "--probes", "20000"}
	over, out := runDemoReport(t, append([]string{"--transport", "grpc"}, args...)...)
	checkSummary(t, over, out, 3)
	assert.Contains(t, out, "router over grpc")
	m := regexp.MustCompile(`over gRPC: (\d+) SubscribeKvPool streams, (\d+) FilterUpdates received`).FindStringSubmatch(out)
	require.NotNil(t, m, "the summary has no gRPC counts:\n%s", out)
	streams, _ := strconv.Atoi(m[1])
	updates, _ := strconv.Atoi(m[2])
	assert.GreaterOrEqual(t, streams, 3, "a SubscribeKvPool stream per lane")
	assert.Greater(t, updates, streams, "snapshots and deltas arrived over the pool streams")

	http, _ := runDemoReport(t, args...)
	assert.Zero(t, over.LanesNotReady, "every gRPC lane answered every request")
	assert.GreaterOrEqual(t, over.AgreementPct, 97.0, "best-DC agreement over gRPC")
	assert.InDelta(t, http.AgreementPct, over.AgreementPct, 2, "best-DC agreement over gRPC vs over HTTP, percentage points")
	t.Logf("best-DC agreement: grpc %d/%d (%.3f%%), http %d/%d (%.3f%%)", over.Agree, over.Requests, over.AgreementPct, http.Agree, http.Requests, http.AgreementPct)
}
