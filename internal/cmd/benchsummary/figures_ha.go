package main

// Hot standby relays (issue #34, cmd/relay/ha_bench_test.go): a group of two
// relay binaries on a 3-node nats-server cluster (separate processes), a
// router with both replicas' addresses. Takeover: SIGKILL of the leader
// while two ZMQ engines publish → the router's lane holds the engines'
// blocks again, over 20 kills (one round: a round is minutes). Ingest: 64
// Stored events × 16 blocks POSTed every 20 ms for 4 s (51,200 blocks/s)
// into a lone relay and into the group's leader in the same run; CPU is the
// relay process's user+system time per admitted block, freshness POST sent
// → block in the router's lane, lag a record the leader appended → the
// standby applied it.
var haFigures = []figure{
	{Name: "ha_takeover_ms_p50", Pkg: "./cmd/relay", Bench: "BenchmarkHATakeover", Metric: "p50-ms", Unit: "ms", Rounds: 1},
	{Name: "ha_takeover_ms_p99", Pkg: "./cmd/relay", Bench: "BenchmarkHATakeover", Metric: "p99-ms", Unit: "ms", Rounds: 1},
	{Name: "ha_relay_cpu_per_block_vs_single", Pkg: "./cmd/relay", Bench: "BenchmarkHAIngest/relay=leader", Base: "BenchmarkHAIngest/relay=single", Metric: "cpu-ns/block", Unit: "ratio", PerRound: true, Rounds: 3},
	{Name: "ha_fresh_p50_vs_single", Pkg: "./cmd/relay", Bench: "BenchmarkHAIngest/relay=leader", Base: "BenchmarkHAIngest/relay=single", Metric: "fresh-p50-ns", Unit: "ratio", PerRound: true, Rounds: 3},
	{Name: "ha_standby_lag_ms_p99", Pkg: "./cmd/relay", Bench: "BenchmarkHAIngest/relay=leader", Metric: "lag-p99-ms", Unit: "ms", Rounds: 3},
}

func init() { figures = append(figures, haFigures...) }
