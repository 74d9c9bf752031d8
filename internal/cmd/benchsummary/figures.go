package main

// figures is the list of BENCH summary lines, in print order. Each entry names
// the package that produces it, the benchmark (as go test prints it, without
// the -GOMAXPROCS suffix), the metric column to read and, for a ratio, the
// baseline benchmark measured in the same run. See the package comment for how
// to add one.
//
// Ratios are the benchmark's metric over the baseline's, so for ns/op a ratio
// below 1 means the first is faster. Targets live in BENCHMARKS.md, not here:
// this tool reports, it does not judge.
var figures = []figure{
	// ckf.Filter against github.com/seiflotfy/cuckoofilter and
	// github.com/bits-and-blooms/bloom/v3, 1M keys, 2^18 buckets (95.4% load).
	{Name: "ckf_filter_insert_vs_seiflotfy", Pkg: "./ckf", Bench: "BenchmarkFilterInsert/lib=ckf/n=1M", Base: "BenchmarkFilterInsert/lib=seiflotfy/n=1M", Metric: "ns/insert", Unit: "ratio"},
	{Name: "ckf_filter_lookup_hit_vs_seiflotfy", Pkg: "./ckf", Bench: "BenchmarkFilterLookup/hit/lib=ckf/n=1M", Base: "BenchmarkFilterLookup/hit/lib=seiflotfy/n=1M", Metric: "ns/op", Unit: "ratio"},
	{Name: "ckf_filter_lookup_miss_vs_seiflotfy", Pkg: "./ckf", Bench: "BenchmarkFilterLookup/miss/lib=ckf/n=1M", Base: "BenchmarkFilterLookup/miss/lib=seiflotfy/n=1M", Metric: "ns/op", Unit: "ratio"},
	{Name: "ckf_filter_insert_vs_bloom", Pkg: "./ckf", Bench: "BenchmarkFilterInsert/lib=ckf/n=1M", Base: "BenchmarkFilterInsert/lib=bloom/n=1M", Metric: "ns/insert", Unit: "ratio"},
	{Name: "ckf_filter_lookup_hit_vs_bloom", Pkg: "./ckf", Bench: "BenchmarkFilterLookup/hit/lib=ckf/n=1M", Base: "BenchmarkFilterLookup/hit/lib=bloom/n=1M", Metric: "ns/op", Unit: "ratio"},
	{Name: "ckf_filter_lookup_miss_vs_bloom", Pkg: "./ckf", Bench: "BenchmarkFilterLookup/miss/lib=ckf/n=1M", Base: "BenchmarkFilterLookup/miss/lib=bloom/n=1M", Metric: "ns/op", Unit: "ratio"},
	{Name: "ckf_filter_insert_ns", Pkg: "./ckf", Bench: "BenchmarkFilterInsert/lib=ckf/n=1M", Metric: "ns/insert", Unit: "ns"},
	{Name: "ckf_filter_lookup_hit_ns", Pkg: "./ckf", Bench: "BenchmarkFilterLookup/hit/lib=ckf/n=1M", Metric: "ns/op", Unit: "ns"},
	{Name: "ckf_filter_lookup_miss_ns", Pkg: "./ckf", Bench: "BenchmarkFilterLookup/miss/lib=ckf/n=1M", Metric: "ns/op", Unit: "ns"},
	{Name: "ckf_filter_fpr", Pkg: "./ckf", Bench: "BenchmarkFilterLookup/miss/lib=ckf/n=1M", Metric: "fpr", Unit: "fraction"},
	{Name: "ckf_filter_fpr_seiflotfy", Pkg: "./ckf", Bench: "BenchmarkFilterLookup/miss/lib=seiflotfy/n=1M", Metric: "fpr", Unit: "fraction"},
	{Name: "ckf_filter_fpr_bloom", Pkg: "./ckf", Bench: "BenchmarkFilterLookup/miss/lib=bloom/n=1M", Metric: "fpr", Unit: "fraction"},

	// ckf.Pool.ApplyEvent against a map-only exact index, 16-block chained
	// Stored events, ExpectedBlocks 1,048,576, at 50% and 90% of it.
	{Name: "ckf_pool_apply_vs_map_50", Pkg: "./ckf", Bench: "BenchmarkPoolApplyEvent/load=50/impl=pool", Base: "BenchmarkPoolApplyEvent/load=50/impl=map", Metric: "ns/op", Unit: "ratio"},
	{Name: "ckf_pool_apply_vs_map_90", Pkg: "./ckf", Bench: "BenchmarkPoolApplyEvent/load=90/impl=pool", Base: "BenchmarkPoolApplyEvent/load=90/impl=map", Metric: "ns/op", Unit: "ratio"},
	{Name: "ckf_pool_apply_blocks_per_s_50", Pkg: "./ckf", Bench: "BenchmarkPoolApplyEvent/load=50/impl=pool", Metric: "blocks/s", Unit: "blocks/s"},
	{Name: "ckf_pool_apply_blocks_per_s_90", Pkg: "./ckf", Bench: "BenchmarkPoolApplyEvent/load=90/impl=pool", Metric: "blocks/s", Unit: "blocks/s"},
	{Name: "ckf_map_apply_blocks_per_s_90", Pkg: "./ckf", Bench: "BenchmarkPoolApplyEvent/load=90/impl=map", Metric: "blocks/s", Unit: "blocks/s"},

	// The same workload in engine batches of 64 events: the parallel apply
	// (Pool.ApplyEvents) with 2 workers against the sequential apply
	// (ApplyEvent one by one) of the same events, and the curve over 1, 2
	// and 4 workers.
	{Name: "ckf_pool_apply_parallel_vs_serial_50", Pkg: "./ckf", Bench: "BenchmarkPoolApplyParallel/load=50/impl=workers2", Base: "BenchmarkPoolApplyParallel/load=50/impl=serial", Metric: "blocks/s", Unit: "ratio"},
	{Name: "ckf_pool_apply_parallel_vs_serial_90", Pkg: "./ckf", Bench: "BenchmarkPoolApplyParallel/load=90/impl=workers2", Base: "BenchmarkPoolApplyParallel/load=90/impl=serial", Metric: "blocks/s", Unit: "ratio"},
	// The same, from each run's median batch (p50-ns/op: a few batches
	// stretched by another process's hold on a core leave it alone),
	// serial over 2 workers so that above 1 is again the parallel apply
	// faster.
	{Name: "ckf_pool_apply_parallel_vs_serial_p50_50", Pkg: "./ckf", Bench: "BenchmarkPoolApplyParallel/load=50/impl=serial", Base: "BenchmarkPoolApplyParallel/load=50/impl=workers2", Metric: "p50-ns/op", Unit: "ratio"},
	{Name: "ckf_pool_apply_parallel_vs_serial_p50_90", Pkg: "./ckf", Bench: "BenchmarkPoolApplyParallel/load=90/impl=serial", Base: "BenchmarkPoolApplyParallel/load=90/impl=workers2", Metric: "p50-ns/op", Unit: "ratio"},
	{Name: "ckf_pool_apply_parallel_blocks_per_s_50_workers1", Pkg: "./ckf", Bench: "BenchmarkPoolApplyParallel/load=50/impl=workers1", Metric: "blocks/s", Unit: "blocks/s"},
	{Name: "ckf_pool_apply_parallel_blocks_per_s_50_workers2", Pkg: "./ckf", Bench: "BenchmarkPoolApplyParallel/load=50/impl=workers2", Metric: "blocks/s", Unit: "blocks/s"},
	{Name: "ckf_pool_apply_parallel_blocks_per_s_50_workers4", Pkg: "./ckf", Bench: "BenchmarkPoolApplyParallel/load=50/impl=workers4", Metric: "blocks/s", Unit: "blocks/s"},
	{Name: "ckf_pool_apply_parallel_blocks_per_s_90_workers1", Pkg: "./ckf", Bench: "BenchmarkPoolApplyParallel/load=90/impl=workers1", Metric: "blocks/s", Unit: "blocks/s"},
	{Name: "ckf_pool_apply_parallel_blocks_per_s_90_workers2", Pkg: "./ckf", Bench: "BenchmarkPoolApplyParallel/load=90/impl=workers2", Metric: "blocks/s", Unit: "blocks/s"},
	{Name: "ckf_pool_apply_parallel_blocks_per_s_90_workers4", Pkg: "./ckf", Bench: "BenchmarkPoolApplyParallel/load=90/impl=workers4", Metric: "blocks/s", Unit: "blocks/s"},

	// The host's own scaling, the ceiling of any parallel apply on it: two
	// goroutines on two independent 4 M-entry maps (memory-latency bound,
	// the exact state's shape) and on pure arithmetic, against one
	// goroutine doing both, in probes/s (ratio > 1: two are faster).
	{Name: "host_map_probes_two_vs_one_goroutine", Pkg: "./ckf", Bench: "BenchmarkHostScaling/work=map/impl=two", Base: "BenchmarkHostScaling/work=map/impl=one", Metric: "probes/s", Unit: "ratio"},
	{Name: "host_spin_two_vs_one_goroutine", Pkg: "./ckf", Bench: "BenchmarkHostScaling/work=spin/impl=two", Base: "BenchmarkHostScaling/work=spin/impl=one", Metric: "probes/s", Unit: "ratio"},
	// CPU per step beside the wall time: on a loaded machine the CPU an
	// apply takes swings far less than its wall time.
	{Name: "ckf_pool_apply_vs_map_cpu_50", Pkg: "./ckf", Bench: "BenchmarkPoolApplyEvent/load=50/impl=pool", Base: "BenchmarkPoolApplyEvent/load=50/impl=map", Metric: "cpu-ns/op", Unit: "ratio"},
	{Name: "ckf_pool_apply_vs_map_cpu_90", Pkg: "./ckf", Bench: "BenchmarkPoolApplyEvent/load=90/impl=pool", Base: "BenchmarkPoolApplyEvent/load=90/impl=map", Metric: "cpu-ns/op", Unit: "ratio"},

	// Scale: the relay's apply (its default 1 worker, batches of 64) at 1 M,
	// 8 M and 32 M tracked blocks, with the exact state's heap per block.
	// One round: filling 32 M blocks takes tens of seconds.
	{Name: "ckf_pool_scale_blocks_per_s_1m", Pkg: "./ckf", Bench: "BenchmarkPoolApplyScale/blocks=1M", Metric: "blocks/s", Unit: "blocks/s", Rounds: 1},
	{Name: "ckf_pool_scale_bytes_per_block_1m", Pkg: "./ckf", Bench: "BenchmarkPoolApplyScale/blocks=1M", Metric: "B/block", Unit: "bytes", Rounds: 1},
	{Name: "ckf_pool_scale_blocks_per_s_8m", Pkg: "./ckf", Bench: "BenchmarkPoolApplyScale/blocks=8M", Metric: "blocks/s", Unit: "blocks/s", Rounds: 1},
	{Name: "ckf_pool_scale_bytes_per_block_8m", Pkg: "./ckf", Bench: "BenchmarkPoolApplyScale/blocks=8M", Metric: "B/block", Unit: "bytes", Rounds: 1},
	{Name: "ckf_pool_scale_blocks_per_s_32m", Pkg: "./ckf", Bench: "BenchmarkPoolApplyScale/blocks=32M", Metric: "blocks/s", Unit: "blocks/s", Rounds: 1},
	{Name: "ckf_pool_scale_bytes_per_block_32m", Pkg: "./ckf", Bench: "BenchmarkPoolApplyScale/blocks=32M", Metric: "B/block", Unit: "bytes", Rounds: 1},

	// Exact state per tracked block at 1,048,576 blocks: measured live heap,
	// the pool's own Stats estimate, and the map-only baseline.
	{Name: "ckf_pool_bytes_per_block", Pkg: "./ckf", Bench: "BenchmarkPoolExactState/impl=pool/n=1M", Metric: "B/block", Unit: "bytes"},
	{Name: "ckf_pool_bytes_per_block_estimate", Pkg: "./ckf", Bench: "BenchmarkPoolExactState/impl=pool/n=1M", Metric: "est-B/block", Unit: "bytes"},
	{Name: "ckf_map_bytes_per_block", Pkg: "./ckf", Bench: "BenchmarkPoolExactState/impl=map/n=1M", Metric: "B/block", Unit: "bytes"},

	// consumer: prefix query latency with hashing included (16-token blocks,
	// 524,288 buckets, 50% load; lane l holds the first D*(16-l)/16 blocks),
	// delta apply throughput and snapshot install throughput.
	{Name: "consumer_query_tokens_d32_l1_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=32/lanes=1", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d32_l1_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=32/lanes=1", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d32_l4_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=32/lanes=4", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d32_l4_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=32/lanes=4", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d32_l16_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=32/lanes=16", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d32_l16_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=32/lanes=16", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d128_l1_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=128/lanes=1", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d128_l1_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=128/lanes=1", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d128_l4_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=128/lanes=4", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d128_l4_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=128/lanes=4", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d128_l16_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=128/lanes=16", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d128_l16_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=128/lanes=16", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d1024_l1_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=1024/lanes=1", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d1024_l1_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=1024/lanes=1", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d1024_l4_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=1024/lanes=4", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d1024_l4_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=1024/lanes=4", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d1024_l16_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=1024/lanes=16", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_tokens_d1024_l16_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=tokens/depth=1024/lanes=16", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d32_l1_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=32/lanes=1", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d32_l1_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=32/lanes=1", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d32_l4_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=32/lanes=4", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d32_l4_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=32/lanes=4", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d32_l16_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=32/lanes=16", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d32_l16_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=32/lanes=16", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d128_l1_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=128/lanes=1", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d128_l1_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=128/lanes=1", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d128_l4_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=128/lanes=4", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d128_l4_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=128/lanes=4", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d128_l16_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=128/lanes=16", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d128_l16_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=128/lanes=16", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d1024_l1_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=1024/lanes=1", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d1024_l1_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=1024/lanes=1", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d1024_l4_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=1024/lanes=4", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d1024_l4_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=1024/lanes=4", Metric: "p99-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d1024_l16_p50_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=1024/lanes=16", Metric: "p50-ns", Unit: "ns"},
	{Name: "consumer_query_locals_d1024_l16_p99_ns", Pkg: "./consumer", Bench: "BenchmarkConsumerQuery/by=locals/depth=1024/lanes=16", Metric: "p99-ns", Unit: "ns"},
	// 16 ready lanes at depth 1024 (lane l holds 1024*(16-l)/16 blocks) in
	// four format groups of four lanes (four pool sizes; one seed or four)
	// over the same lanes in one 16-lane group, measured in one run: the
	// two layouts' queries timed in turns, the figure the median over the
	// rounds of their same-round p50 ratio (as the wasm figures below).
	{Name: "consumer_query_mixed4_vs_uniform_tokens", Pkg: "./consumer", Bench: "BenchmarkConsumerQueryMixed/by=tokens/seeds=1", Base: "BenchmarkConsumerQueryMixed/by=tokens/seeds=1", Metric: "mixed4-p50-ns", BaseMetric: "uniform-p50-ns", Unit: "ratio", PerRound: true},
	{Name: "consumer_query_mixed4_vs_uniform_tokens_4seeds", Pkg: "./consumer", Bench: "BenchmarkConsumerQueryMixed/by=tokens/seeds=4", Base: "BenchmarkConsumerQueryMixed/by=tokens/seeds=4", Metric: "mixed4-p50-ns", BaseMetric: "uniform-p50-ns", Unit: "ratio", PerRound: true},
	{Name: "consumer_query_mixed4_vs_uniform_seq", Pkg: "./consumer", Bench: "BenchmarkConsumerQueryMixed/by=seq/seeds=1", Base: "BenchmarkConsumerQueryMixed/by=seq/seeds=1", Metric: "mixed4-p50-ns", BaseMetric: "uniform-p50-ns", Unit: "ratio", PerRound: true},
	{Name: "consumer_query_mixed4_vs_uniform_seq_4seeds", Pkg: "./consumer", Bench: "BenchmarkConsumerQueryMixed/by=seq/seeds=4", Base: "BenchmarkConsumerQueryMixed/by=seq/seeds=4", Metric: "mixed4-p50-ns", BaseMetric: "uniform-p50-ns", Unit: "ratio", PerRound: true},
	{Name: "consumer_delta_apply_struct_images_per_s", Pkg: "./consumer", Bench: "BenchmarkConsumerApplyDelta/path=struct", Metric: "images/s", Unit: "images/s"},
	{Name: "consumer_delta_apply_bytes_images_per_s", Pkg: "./consumer", Bench: "BenchmarkConsumerApplyDelta/path=bytes", Metric: "images/s", Unit: "images/s"},
	{Name: "consumer_snapshot_install_words_mb_per_s", Pkg: "./consumer", Bench: "BenchmarkConsumerInstallSnapshot/path=words", Metric: "MB/s", Unit: "MB/s"},
	{Name: "consumer_snapshot_install_frames_mb_per_s", Pkg: "./consumer", Bench: "BenchmarkConsumerInstallSnapshot/path=frames", Metric: "MB/s", Unit: "MB/s"},

	// wire: frame encode and decode throughput (an 8 MiB snapshot chunk and a
	// 64-image delta; decode copies the words out, as a native consumer does).
	{Name: "wire_encode_snapshot_mb_per_s", Pkg: "./wire", Bench: "BenchmarkFrameEncode/snapshot=8MiB", Metric: "MB/s", Unit: "MB/s"},
	{Name: "wire_encode_delta_mb_per_s", Pkg: "./wire", Bench: "BenchmarkFrameEncode/delta=64", Metric: "MB/s", Unit: "MB/s"},
	{Name: "wire_decode_snapshot_mb_per_s", Pkg: "./wire", Bench: "BenchmarkFrameDecode/snapshot=8MiB/copy", Metric: "MB/s", Unit: "MB/s"},
	{Name: "wire_decode_delta_mb_per_s", Pkg: "./wire", Bench: "BenchmarkFrameDecode/delta=64/copy", Metric: "MB/s", Unit: "MB/s"},

	// producer: AdmitEvent through the actor (draining subscriber, timed until
	// everything is applied and published) against direct Pool.ApplyEvent on
	// the same 4-block Stored/Removed ring; admission latency at 50% of the
	// measured maximum rate.
	{Name: "producer_actor_vs_pool", Pkg: "./producer", Bench: "BenchmarkActorAdmit/impl=actor", Base: "BenchmarkActorAdmit/impl=pool", Metric: "ns/op", Unit: "ratio"},
	{Name: "producer_actor_events_per_s", Pkg: "./producer", Bench: "BenchmarkActorAdmit/impl=actor", Metric: "events/s", Unit: "events/s"},
	{Name: "producer_actor_blocks_per_s", Pkg: "./producer", Bench: "BenchmarkActorAdmit/impl=actor", Metric: "blocks/s", Unit: "blocks/s"},
	{Name: "producer_pool_events_per_s", Pkg: "./producer", Bench: "BenchmarkActorAdmit/impl=pool", Metric: "events/s", Unit: "events/s"},
	{Name: "producer_actor_batch64_events_per_s", Pkg: "./producer", Bench: "BenchmarkActorAdmit/impl=actor-batch64", Metric: "events/s", Unit: "events/s"},
	{Name: "producer_actor_batch64_vs_actor", Pkg: "./producer", Bench: "BenchmarkActorAdmit/impl=actor-batch64", Base: "BenchmarkActorAdmit/impl=actor", Metric: "ns/op", Unit: "ratio"},
	{Name: "producer_actor_batch64_vs_pool", Pkg: "./producer", Bench: "BenchmarkActorAdmit/impl=actor-batch64", Base: "BenchmarkActorAdmit/impl=pool", Metric: "ns/op", Unit: "ratio"},
	// The same batches, each allocated and copied by the caller (the
	// benchmark's shape before 2026-12-06: the caller's garbage, not the
	// actor's cost).
	{Name: "producer_actor_batch64_alloc_vs_pool", Pkg: "./producer", Bench: "BenchmarkActorAdmit/impl=actor-batch64-alloc", Base: "BenchmarkActorAdmit/impl=pool", Metric: "ns/op", Unit: "ratio"},
	// The same ratios in CPU per event (the whole process's: on 2 cores the
	// caller's admission runs beside the actor, so wall time hides it while
	// the machine is idle and shows it when it is loaded).
	{Name: "producer_actor_vs_pool_cpu", Pkg: "./producer", Bench: "BenchmarkActorAdmit/impl=actor", Base: "BenchmarkActorAdmit/impl=pool", Metric: "cpu-ns/op", Unit: "ratio"},
	{Name: "producer_actor_batch64_vs_pool_cpu", Pkg: "./producer", Bench: "BenchmarkActorAdmit/impl=actor-batch64", Base: "BenchmarkActorAdmit/impl=pool", Metric: "cpu-ns/op", Unit: "ratio"},
	{Name: "producer_admit_p50_ns", Pkg: "./producer", Bench: "BenchmarkActorLatency/rate=50pct", Metric: "p50-ns", Unit: "ns"},
	{Name: "producer_admit_p99_ns", Pkg: "./producer", Bench: "BenchmarkActorLatency/rate=50pct", Metric: "p99-ns", Unit: "ns"},

	// relay: batches of 64 Stored events × 4 blocks POSTed over loopback HTTP
	// into one pool with 16 stream subscribers attached; freshness is POST
	// accepted → block visible in a remote native consumer.
	{Name: "relay_load_events_per_s", Pkg: "./internal/server", Bench: "BenchmarkRelayLoad", Metric: "events/s", Unit: "events/s"},
	{Name: "relay_load_blocks_per_s", Pkg: "./internal/server", Bench: "BenchmarkRelayLoad", Metric: "blocks/s", Unit: "blocks/s"},
	{Name: "relay_freshness_p50_ns", Pkg: "./internal/server", Bench: "BenchmarkRelayLoad", Metric: "fresh-p50-ns", Unit: "ns"},
	{Name: "relay_freshness_p99_ns", Pkg: "./internal/server", Bench: "BenchmarkRelayLoad", Metric: "fresh-p99-ns", Unit: "ns"},

	// ingest end to end through both doors of one relay, the same batches
	// (64 Stored events × 4 blocks): an emulated vLLM engine's ZMQ PUB socket
	// into the pool's ZMQ source, and HTTP POSTs of RouterEvent JSON; a
	// subscribed consumer sees the blocks. Freshness is paced (one batch in
	// flight). The source's own decode + convert cost is beside it.
	{Name: "ingest_zmq_events_per_s", Pkg: "./internal/server", Bench: "BenchmarkIngest/transport=zmq", Metric: "events/s", Unit: "events/s"},
	{Name: "ingest_zmq_blocks_per_s", Pkg: "./internal/server", Bench: "BenchmarkIngest/transport=zmq", Metric: "blocks/s", Unit: "blocks/s"},
	{Name: "ingest_zmq_freshness_p50_ns", Pkg: "./internal/server", Bench: "BenchmarkIngest/transport=zmq", Metric: "fresh-p50-ns", Unit: "ns"},
	{Name: "ingest_zmq_freshness_p99_ns", Pkg: "./internal/server", Bench: "BenchmarkIngest/transport=zmq", Metric: "fresh-p99-ns", Unit: "ns"},
	{Name: "ingest_http_events_per_s", Pkg: "./internal/server", Bench: "BenchmarkIngest/transport=http", Metric: "events/s", Unit: "events/s"},
	{Name: "ingest_http_blocks_per_s", Pkg: "./internal/server", Bench: "BenchmarkIngest/transport=http", Metric: "blocks/s", Unit: "blocks/s"},
	{Name: "ingest_http_freshness_p50_ns", Pkg: "./internal/server", Bench: "BenchmarkIngest/transport=http", Metric: "fresh-p50-ns", Unit: "ns"},
	{Name: "ingest_http_freshness_p99_ns", Pkg: "./internal/server", Bench: "BenchmarkIngest/transport=http", Metric: "fresh-p99-ns", Unit: "ns"},
	{Name: "ingest_zmq_vs_http_blocks_per_s", Pkg: "./internal/server", Bench: "BenchmarkIngest/transport=zmq", Base: "BenchmarkIngest/transport=http", Metric: "blocks/s", Unit: "ratio"},
	{Name: "ingest_zmq_vs_pool_apply", Pkg: "./internal/server", Bench: "BenchmarkIngest/transport=zmq", Base: "BenchmarkIngest/transport=pool-apply", Metric: "blocks/s", Unit: "ratio"},
	{Name: "ingest_pool_apply_blocks_per_s", Pkg: "./internal/server", Bench: "BenchmarkIngest/transport=pool-apply", Metric: "blocks/s", Unit: "blocks/s"},
	{Name: "ingest_zmq_decode_convert_blocks_per_s", Pkg: "./internal/source/zmq", Bench: "BenchmarkDecodeConvert/form=positional", Metric: "blocks/s", Unit: "blocks/s"},

	// wasm/host: the consumer module under wazero against the native consumer
	// through the same client.Lanes interface, in the same run (524,288
	// buckets × 16 lanes, 16-token blocks, every lane holding the request).
	{Name: "wasm_query_tokens_d32_vs_native", Pkg: "./wasm/host", Bench: "BenchmarkQuery/by=tokens/depth=32/impl=wasm", Base: "BenchmarkQuery/by=tokens/depth=32/impl=native", Metric: "p50-ns", Unit: "ratio"},
	{Name: "wasm_query_tokens_d128_vs_native", Pkg: "./wasm/host", Bench: "BenchmarkQuery/by=tokens/depth=128/impl=wasm", Base: "BenchmarkQuery/by=tokens/depth=128/impl=native", Metric: "p50-ns", Unit: "ratio"},
	{Name: "wasm_query_tokens_d1024_vs_native", Pkg: "./wasm/host", Bench: "BenchmarkQuery/by=tokens/depth=1024/impl=wasm", Base: "BenchmarkQuery/by=tokens/depth=1024/impl=native", Metric: "p50-ns", Unit: "ratio"},
	{Name: "wasm_query_tokens_d32_p50_ns", Pkg: "./wasm/host", Bench: "BenchmarkQuery/by=tokens/depth=32/impl=wasm", Metric: "p50-ns", Unit: "ns"},
	{Name: "wasm_query_tokens_d32_p99_ns", Pkg: "./wasm/host", Bench: "BenchmarkQuery/by=tokens/depth=32/impl=wasm", Metric: "p99-ns", Unit: "ns"},
	{Name: "wasm_query_tokens_d128_p50_ns", Pkg: "./wasm/host", Bench: "BenchmarkQuery/by=tokens/depth=128/impl=wasm", Metric: "p50-ns", Unit: "ns"},
	{Name: "wasm_query_tokens_d128_p99_ns", Pkg: "./wasm/host", Bench: "BenchmarkQuery/by=tokens/depth=128/impl=wasm", Metric: "p99-ns", Unit: "ns"},
	{Name: "wasm_query_tokens_d1024_p50_ns", Pkg: "./wasm/host", Bench: "BenchmarkQuery/by=tokens/depth=1024/impl=wasm", Metric: "p50-ns", Unit: "ns"},
	{Name: "wasm_query_tokens_d1024_p99_ns", Pkg: "./wasm/host", Bench: "BenchmarkQuery/by=tokens/depth=1024/impl=wasm", Metric: "p99-ns", Unit: "ns"},
	{Name: "wasm_query_seq_d128_vs_native", Pkg: "./wasm/host", Bench: "BenchmarkQuery/by=seq/depth=128/impl=wasm", Base: "BenchmarkQuery/by=seq/depth=128/impl=native", Metric: "p50-ns", Unit: "ratio"},
	{Name: "wasm_query_seq_d1024_vs_native", Pkg: "./wasm/host", Bench: "BenchmarkQuery/by=seq/depth=1024/impl=wasm", Base: "BenchmarkQuery/by=seq/depth=1024/impl=native", Metric: "p50-ns", Unit: "ratio"},
	// The WebAssembly module: 16 lanes hitting all 1024 blocks in four
	// format groups over one 16-lane group (BenchmarkQuery's table). The
	// benchmark times the two layouts' queries in turns and reports both
	// p50s, so they share every burst of load; the figure is the median
	// over the rounds of their same-round ratio. (The ratio of two
	// sub-benchmarks' p50s, each the median of its own rounds, could pair a
	// quiet run of one with a disturbed run of the other: BENCHMARKS.md,
	// "Format groups".)
	{Name: "wasm_query_tokens_d1024_mixed4_vs_uniform", Pkg: "./wasm/host", Bench: "BenchmarkQueryMixed/by=tokens/seeds=1/impl=wasm", Base: "BenchmarkQueryMixed/by=tokens/seeds=1/impl=wasm", Metric: "mixed4-p50-ns", BaseMetric: "uniform-p50-ns", Unit: "ratio", PerRound: true},
	{Name: "wasm_query_tokens_d1024_mixed4_vs_uniform_4seeds", Pkg: "./wasm/host", Bench: "BenchmarkQueryMixed/by=tokens/seeds=4/impl=wasm", Base: "BenchmarkQueryMixed/by=tokens/seeds=4/impl=wasm", Metric: "mixed4-p50-ns", BaseMetric: "uniform-p50-ns", Unit: "ratio", PerRound: true},
	{Name: "wasm_query_seq_d1024_mixed4_vs_uniform", Pkg: "./wasm/host", Bench: "BenchmarkQueryMixed/by=seq/seeds=1/impl=wasm", Base: "BenchmarkQueryMixed/by=seq/seeds=1/impl=wasm", Metric: "mixed4-p50-ns", BaseMetric: "uniform-p50-ns", Unit: "ratio", PerRound: true},
	{Name: "wasm_query_seq_d1024_mixed4_vs_uniform_4seeds", Pkg: "./wasm/host", Bench: "BenchmarkQueryMixed/by=seq/seeds=4/impl=wasm", Base: "BenchmarkQueryMixed/by=seq/seeds=4/impl=wasm", Metric: "mixed4-p50-ns", BaseMetric: "uniform-p50-ns", Unit: "ratio", PerRound: true},
	{Name: "wasm_query_seq_d1024_p50_ns", Pkg: "./wasm/host", Bench: "BenchmarkQuery/by=seq/depth=1024/impl=wasm", Metric: "p50-ns", Unit: "ns"},
	{Name: "wasm_native_query_tokens_d1024_p50_ns", Pkg: "./wasm/host", Bench: "BenchmarkQuery/by=tokens/depth=1024/impl=native", Metric: "p50-ns", Unit: "ns"},
	{Name: "wasm_native_query_seq_d1024_p50_ns", Pkg: "./wasm/host", Bench: "BenchmarkQuery/by=seq/depth=1024/impl=native", Metric: "p50-ns", Unit: "ns"},
	{Name: "wasm_contains_ns", Pkg: "./wasm/host", Bench: "BenchmarkContains/impl=wasm", Metric: "ns/op", Unit: "ns"},
	{Name: "wasm_contains_vs_native", Pkg: "./wasm/host", Bench: "BenchmarkContains/impl=wasm", Base: "BenchmarkContains/impl=native", Metric: "ns/op", Unit: "ratio"},
	{Name: "wasm_snapshot_install_mb_per_s", Pkg: "./wasm/host", Bench: "BenchmarkSnapshotInstall/impl=wasm", Metric: "MB/s", Unit: "MB/s"},
	{Name: "wasm_native_snapshot_install_mb_per_s", Pkg: "./wasm/host", Bench: "BenchmarkSnapshotInstall/impl=native", Metric: "MB/s", Unit: "MB/s"},
	{Name: "wasm_delta_apply_images_per_s", Pkg: "./wasm/host", Bench: "BenchmarkDeltaApply/impl=wasm", Metric: "images/s", Unit: "images/s"},
	{Name: "wasm_native_delta_apply_images_per_s", Pkg: "./wasm/host", Bench: "BenchmarkDeltaApply/impl=native", Metric: "images/s", Unit: "images/s"},
	{Name: "wasm_instantiate_configure_ms", Pkg: "./wasm/host", Bench: "BenchmarkInstantiateConfigure/impl=wasm", Metric: "ms/op", Unit: "ms"},
	{Name: "wasm_query_parallel_pool2_vs_instance", Pkg: "./wasm/host", Bench: "BenchmarkQueryParallel/impl=pool2", Base: "BenchmarkQueryParallel/impl=instance", Metric: "ns/op", Unit: "ratio"},
	// js: the same module under Node (js/, node:wasi) beside wazero, one
	// 1024-block request of 16-token blocks by tokens over 16 ready lanes of
	// 524,288 buckets (internal/integration/conformance BenchmarkNodeQuery).
	{Name: "node_query_tokens_d1024_l16_p50_ns", Pkg: "./internal/integration/conformance", Bench: "BenchmarkNodeQuery/impl=node", Metric: "p50-ns", Unit: "ns", Needs: "node"},
	{Name: "node_query_tokens_d1024_l16_p99_ns", Pkg: "./internal/integration/conformance", Bench: "BenchmarkNodeQuery/impl=node", Metric: "p99-ns", Unit: "ns", Needs: "node"},
	{Name: "node_query_tokens_d1024_l16_vs_wazero", Pkg: "./internal/integration/conformance", Bench: "BenchmarkNodeQuery/impl=node", Base: "BenchmarkNodeQuery/impl=wazero", Metric: "p50-ns", Unit: "ratio", Needs: "node"},

	// persist: a relay pool's restart with 1,048,576 tracked blocks (open
	// the Pebble store, load, replay into a fresh actor), from a checkpoint
	// and from a journal of 16,384 64-block events. One restart per
	// iteration; the 1M-block setup runs outside the timer.
	{Name: "persist_restart_1m_blocks_from_checkpoint_s", Pkg: "./internal/persist", Bench: "BenchmarkRestart/from=checkpoint/blocks=1M", Metric: "s/restart", Unit: "s"},
	{Name: "persist_restart_1m_blocks_from_journal_s", Pkg: "./internal/persist", Bench: "BenchmarkRestart/from=journal/blocks=1M", Metric: "s/restart", Unit: "s"},
	// replay: the whole embedded Mooncake synthetic trace (3,993 requests)
	// through 3 and 16 data centers of 4 workers × 2 ranks × 2048 blocks,
	// scored against exact ground truth (BenchmarkReplay, one trace per
	// iteration). Targets: agreement ≥ 99.9%, 0 unexplained under-reports,
	// FPR within 1.5× of 1-(1-1/65535)^(8α).
	{Name: "replay_3dc_agreement_pct", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=cache-aware", Metric: "agreement-pct", Unit: "percent"},
	{Name: "replay_3dc_unexplained_under_reports", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=cache-aware", Metric: "unexplained-under", Unit: "count"},
	{Name: "replay_3dc_fpr_vs_bound", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=cache-aware", Metric: "fpr-ratio", Unit: "x-bound"},
	{Name: "replay_3dc_hit_pct_cache_aware", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=cache-aware", Metric: "hit-pct", Unit: "percent"},
	{Name: "replay_3dc_hit_pct_random", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=random", Metric: "hit-pct", Unit: "percent"},
	{Name: "replay_3dc_events_per_s", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=cache-aware", Metric: "events/s", Unit: "events/s"},
	{Name: "replay_3dc_blocks_per_s", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=cache-aware", Metric: "blocks/s", Unit: "blocks/s"},
	{Name: "replay_3dc_query_p99_ns", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=cache-aware", Metric: "query-p99-ns", Unit: "ns"},
	{Name: "replay_16dc_agreement_pct", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=cache-aware", Metric: "agreement-pct", Unit: "percent"},
	{Name: "replay_16dc_unexplained_under_reports", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=cache-aware", Metric: "unexplained-under", Unit: "count"},
	{Name: "replay_16dc_fpr_vs_bound", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=cache-aware", Metric: "fpr-ratio", Unit: "x-bound"},
	{Name: "replay_16dc_random_fpr_vs_bound", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=random", Metric: "fpr-ratio", Unit: "x-bound"},
	{Name: "replay_16dc_hit_pct_cache_aware", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=cache-aware", Metric: "hit-pct", Unit: "percent"},
	{Name: "replay_16dc_hit_pct_random", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=random", Metric: "hit-pct", Unit: "percent"},
	{Name: "replay_16dc_events_per_s", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=cache-aware", Metric: "events/s", Unit: "events/s"},
	{Name: "replay_16dc_blocks_per_s", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=cache-aware", Metric: "blocks/s", Unit: "blocks/s"},
	{Name: "replay_16dc_query_p99_ns", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=cache-aware", Metric: "query-p99-ns", Unit: "ns"},
	// replay's latency model (docs/RATIONALE.md "Why does replay route with
	// Dynamo's cost and SGLang's guard?"): TTFT per policy on the same trace,
	// and the filter's TTFT over the exact index's (target: within 1%).
	{Name: "replay_3dc_ttft_p50_ms_cache_aware", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=cache-aware", Metric: "ttft-p50-ms", Unit: "ms"},
	{Name: "replay_3dc_ttft_p99_ms_cache_aware", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=cache-aware", Metric: "ttft-p99-ms", Unit: "ms"},
	{Name: "replay_3dc_ttft_p50_ms_cache_aware_exact", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=cache-aware-exact", Metric: "ttft-p50-ms", Unit: "ms"},
	{Name: "replay_3dc_ttft_p99_ms_cache_aware_exact", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=cache-aware-exact", Metric: "ttft-p99-ms", Unit: "ms"},
	{Name: "replay_3dc_ttft_p50_ms_load_only", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=load-only", Metric: "ttft-p50-ms", Unit: "ms"},
	{Name: "replay_3dc_ttft_p99_ms_load_only", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=load-only", Metric: "ttft-p99-ms", Unit: "ms"},
	{Name: "replay_3dc_ttft_p50_ms_random", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=random", Metric: "ttft-p50-ms", Unit: "ms"},
	{Name: "replay_3dc_ttft_p99_ms_random", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=random", Metric: "ttft-p99-ms", Unit: "ms"},
	{Name: "replay_3dc_ttft_p50_ms_round_robin", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=round-robin", Metric: "ttft-p50-ms", Unit: "ms"},
	{Name: "replay_3dc_ttft_p99_ms_round_robin", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=round-robin", Metric: "ttft-p99-ms", Unit: "ms"},
	{Name: "replay_3dc_ttft_p50_filter_vs_exact", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=cache-aware", Base: "BenchmarkReplay/dcs=3/policy=cache-aware-exact", Metric: "ttft-p50-ms", Unit: "ratio"},
	{Name: "replay_3dc_ttft_p99_filter_vs_exact", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=cache-aware", Base: "BenchmarkReplay/dcs=3/policy=cache-aware-exact", Metric: "ttft-p99-ms", Unit: "ratio"},
	{Name: "replay_3dc_rank_imbalance_cache_aware", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=3/policy=cache-aware", Metric: "rank-imbalance", Unit: "x-mean"},
	{Name: "replay_16dc_ttft_p50_ms_cache_aware", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=cache-aware", Metric: "ttft-p50-ms", Unit: "ms"},
	{Name: "replay_16dc_ttft_p99_ms_cache_aware", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=cache-aware", Metric: "ttft-p99-ms", Unit: "ms"},
	{Name: "replay_16dc_ttft_p50_ms_cache_aware_exact", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=cache-aware-exact", Metric: "ttft-p50-ms", Unit: "ms"},
	{Name: "replay_16dc_ttft_p99_ms_cache_aware_exact", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=cache-aware-exact", Metric: "ttft-p99-ms", Unit: "ms"},
	{Name: "replay_16dc_ttft_p50_ms_load_only", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=load-only", Metric: "ttft-p50-ms", Unit: "ms"},
	{Name: "replay_16dc_ttft_p99_ms_load_only", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=load-only", Metric: "ttft-p99-ms", Unit: "ms"},
	{Name: "replay_16dc_ttft_p50_ms_random", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=random", Metric: "ttft-p50-ms", Unit: "ms"},
	{Name: "replay_16dc_ttft_p99_ms_random", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=random", Metric: "ttft-p99-ms", Unit: "ms"},
	{Name: "replay_16dc_ttft_p50_ms_round_robin", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=round-robin", Metric: "ttft-p50-ms", Unit: "ms"},
	{Name: "replay_16dc_ttft_p99_ms_round_robin", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=round-robin", Metric: "ttft-p99-ms", Unit: "ms"},
	{Name: "replay_16dc_ttft_p50_filter_vs_exact", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=cache-aware", Base: "BenchmarkReplay/dcs=16/policy=cache-aware-exact", Metric: "ttft-p50-ms", Unit: "ratio"},
	{Name: "replay_16dc_ttft_p99_filter_vs_exact", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=cache-aware", Base: "BenchmarkReplay/dcs=16/policy=cache-aware-exact", Metric: "ttft-p99-ms", Unit: "ratio"},
	{Name: "replay_16dc_rank_imbalance_cache_aware", Pkg: "./internal/sim/replay", Bench: "BenchmarkReplay/dcs=16/policy=cache-aware", Metric: "rank-imbalance", Unit: "x-mean"},

	// Fan-out to 64 routers of one pool: through the relay's HTTP hub (a
	// stream each) vs through NATS JetStream (one publish, an embedded
	// nats-server fans out) vs through the relay's dynamo.kvrelay.v1 gRPC
	// service (a catalog and a SubscribeKvPool stream each, CBI1 payloads,
	// the same hub as HTTP). One process holds relay, NATS server and
	// routers: cpu and heap per subscriber include the routers' own work;
	// relay-out is what the relay alone sends per op (16 events × 4 blocks).
	{Name: "relay_fanout64_http_fresh_p50_ns", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=http/routers=64", Metric: "fresh-p50-ns", Unit: "ns"},
	{Name: "relay_fanout64_http_fresh_p99_ns", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=http/routers=64", Metric: "fresh-p99-ns", Unit: "ns"},
	{Name: "relay_fanout64_nats_fresh_p50_ns", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=nats/routers=64", Metric: "fresh-p50-ns", Unit: "ns"},
	{Name: "relay_fanout64_nats_fresh_p99_ns", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=nats/routers=64", Metric: "fresh-p99-ns", Unit: "ns"},
	{Name: "relay_fanout64_http_cpu_ns_per_op_sub", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=http/routers=64", Metric: "cpu-ns/op/sub", Unit: "ns"},
	{Name: "relay_fanout64_nats_cpu_ns_per_op_sub", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=nats/routers=64", Metric: "cpu-ns/op/sub", Unit: "ns"},
	{Name: "relay_fanout64_nats_vs_http_cpu", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=nats/routers=64", Base: "BenchmarkFanout/transport=http/routers=64", Metric: "cpu-ns/op/sub", Unit: "ratio"},
	{Name: "relay_fanout64_http_heap_bytes_per_sub", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=http/routers=64", Metric: "heap-B/sub", Unit: "bytes"},
	{Name: "relay_fanout64_nats_heap_bytes_per_sub", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=nats/routers=64", Metric: "heap-B/sub", Unit: "bytes"},
	{Name: "relay_fanout64_http_relay_out_bytes_per_op", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=http/routers=64", Metric: "relay-out-B/op", Unit: "bytes"},
	{Name: "relay_fanout64_nats_relay_out_bytes_per_op", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=nats/routers=64", Metric: "relay-out-B/op", Unit: "bytes"},
	{Name: "relay_fanout64_nats_vs_http_relay_out", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=nats/routers=64", Base: "BenchmarkFanout/transport=http/routers=64", Metric: "relay-out-B/op", Unit: "ratio"},
	{Name: "relay_fanout64_grpc_fresh_p50_ns", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=grpc/routers=64", Metric: "fresh-p50-ns", Unit: "ns"},
	{Name: "relay_fanout64_grpc_fresh_p99_ns", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=grpc/routers=64", Metric: "fresh-p99-ns", Unit: "ns"},
	{Name: "relay_fanout64_grpc_vs_http_fresh_p50", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=grpc/routers=64", Base: "BenchmarkFanout/transport=http/routers=64", Metric: "fresh-p50-ns", Unit: "ratio"},
	{Name: "relay_fanout64_http_fresh_p90_ns", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=http/routers=64", Metric: "fresh-p90-ns", Unit: "ns"},
	{Name: "relay_fanout64_grpc_fresh_p90_ns", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=grpc/routers=64", Metric: "fresh-p90-ns", Unit: "ns"},
	// The tail swings with the machine's load from round to round: the
	// median of the same-round ratios (issue #33).
	{Name: "relay_fanout64_grpc_vs_http_fresh_p90", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=grpc/routers=64", Base: "BenchmarkFanout/transport=http/routers=64", Metric: "fresh-p90-ns", Unit: "ratio", PerRound: true},
	{Name: "relay_fanout64_grpc_cpu_ns_per_op_sub", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=grpc/routers=64", Metric: "cpu-ns/op/sub", Unit: "ns"},
	{Name: "relay_fanout64_grpc_vs_http_cpu", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=grpc/routers=64", Base: "BenchmarkFanout/transport=http/routers=64", Metric: "cpu-ns/op/sub", Unit: "ratio"},
	{Name: "relay_fanout64_grpc_heap_bytes_per_sub", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=grpc/routers=64", Metric: "heap-B/sub", Unit: "bytes"},
	{Name: "relay_fanout64_grpc_relay_out_bytes_per_op", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=grpc/routers=64", Metric: "relay-out-B/op", Unit: "bytes"},
	{Name: "relay_fanout64_grpc_vs_http_relay_out", Pkg: "./internal/server", Bench: "BenchmarkFanout/transport=grpc/routers=64", Base: "BenchmarkFanout/transport=http/routers=64", Metric: "relay-out-B/op", Unit: "ratio"},
}

// runtimeFigures are the four-runtime table (internal/integration/wasmtime
// BenchmarkRuntimes, a nested cgo module): the consumer natively and as the
// module under wazero, wasmtime and Node, side by side in one run; 16 ready
// lanes of 524,288 buckets, 16-token blocks. Per runtime the p50 of each
// operation, and for the three wasm hosts the ratio to native's p50 (install
// in MB/s from the p50, instantiate+configure in ms).
func runtimeFigures() []figure {
	const pkg, mod, top = "./internal/integration/wasmtime", "internal/integration/wasmtime", "BenchmarkRuntimes/"
	needs := map[string]string{"native": "gcc", "wazero": "gcc", "wasmtime": "gcc", "node": "gcc node"}
	impls := []string{"native", "wazero", "wasmtime", "node"}
	var out []figure
	add := func(name, bench, base, metric, unit, impl string) {
		out = append(out, figure{Name: "runtimes_" + name, Pkg: pkg, Module: mod, Bench: top + bench, Base: base,
			Metric: metric, Unit: unit, Needs: needs[impl]})
	}
	for _, op := range []string{"tokens", "seq"} {
		for _, d := range []string{"32", "128", "1024"} {
			for _, im := range impls {
				b := "op=" + op + "/depth=" + d + "/impl="
				add(op+"_d"+d+"_"+im+"_p50_ns", b+im, "", "p50-ns", "ns", im)
				if im != "native" {
					add(op+"_d"+d+"_"+im+"_vs_native", b+im, top+b+"native", "p50-ns", "ratio", im)
				}
			}
		}
	}
	for _, im := range impls {
		add("contains_"+im+"_p50_ns", "op=contains/impl="+im, "", "p50-ns", "ns", im)
		add("install_"+im+"_mb_per_s", "op=install/impl="+im, "", "MB/s", "MB/s", im)
		add("instantiate_"+im+"_ms", "op=instantiate/impl="+im, "", "p50-ms", "ms", im)
		if im != "native" {
			add("install_"+im+"_vs_native", "op=install/impl="+im, top+"op=install/impl=native", "p50-ns", "ratio", im)
			add("instantiate_"+im+"_vs_native", "op=instantiate/impl="+im, top+"op=instantiate/impl=native", "p50-ns", "ratio", im)
		}
	}
	return out
}

func init() { figures = append(figures, runtimeFigures()...) }
