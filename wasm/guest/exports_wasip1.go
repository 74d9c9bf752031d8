//go:build wasip1

package main

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

// The exports below are the whole ABI (docs/abi.md). Each one converts its
// (pointer, length) arguments through the registry, so no host input can
// make the module read or write outside a buffer it handed out, and recovers
// any panic into abi.ErrInternal so no input traps the module. Lanes and the
// token block size are i32 in the ABI and read as signed, so lane -1 is
// reported as lane -1 and a negative block size is invalid, as natively.

var (
	g    guest
	heap registry
)

// recovered turns a panic into ErrInternal with its message in last_error.
func recovered(code *int32) {
	if r := recover(); r != nil {
		*code = panicked(r)
	}
}

// panicked records a recovered panic's message and returns ErrInternal.
func panicked(r any) int32 {
	g.lastErr = fmt.Sprint("abi: internal panic: ", r)
	return int32(abi.ErrInternal)
}

func view(p unsafe.Pointer, n uint64) ([]byte, bool) { return heap.view(uintptr(p), n) }

//go:wasmexport abi_version
func exportABIVersion() uint32 { return abi.Version }

// alloc returns a zeroed buffer of size bytes owned by the host until it
// calls free, or 0 when size exceeds abi.MaxAlloc.
//
//go:wasmexport alloc
func exportAlloc(size uint32) (p unsafe.Pointer) {
	defer func() {
		if recover() != nil {
			p = nil
		}
	}()
	b := heap.alloc(size)
	if b == nil {
		return nil
	}
	return unsafe.Pointer(unsafe.SliceData(b))
}

// free releases a buffer returned by alloc: 0, or ErrBadArgument when p is
// not the start of a live buffer.
//
//go:wasmexport free
func exportFree(p unsafe.Pointer) (code int32) {
	defer recovered(&code)
	if !heap.free(uintptr(p)) {
		return int32(g.fail(abi.ErrBadArgument, fmt.Errorf("abi: free(%d): not the start of a live buffer", uintptr(p))))
	}
	return 0
}

//go:wasmexport configure
func exportConfigure(p unsafe.Pointer, n uint32) (code int32) {
	defer recovered(&code)
	b, ok := view(p, uint64(n))
	if !ok {
		return int32(g.fail(abi.ErrBadArgument, nil))
	}
	return int32(g.configure(b))
}

//go:wasmexport assign
func exportAssign(p unsafe.Pointer, n uint32) (code int32) {
	defer recovered(&code)
	b, ok := view(p, uint64(n))
	if !ok {
		return int32(g.fail(abi.ErrBadArgument, nil))
	}
	return int32(g.assign(b))
}

//go:wasmexport retire
func exportRetire(lane int32) (code int32) {
	defer recovered(&code)
	return int32(g.retire(lane))
}

//go:wasmexport apply
func exportApply(p unsafe.Pointer, n uint32) (code int32) {
	var b []byte
	defer func() {
		if r := recover(); r != nil {
			// The lane's words are uncertain (SPEC §5
			// ConsumerWorkerFailureMidApply): take it out of service; its
			// epoch is kept, so the host must assign a newer one.
			lane := -1
			func() {
				defer func() { _ = recover() }()
				lane = g.frameLane(b)
				if lane >= 0 && g.c != nil {
					_ = g.c.Retire(lane)
				}
			}()
			g.lastErr = fmt.Sprint("abi: internal panic: ", r)
			g.last = abi.Result{Code: abi.ErrInternal}
			g.last.Result.Lane = lane
			code = int32(abi.ErrInternal)
		}
	}()
	b, ok := view(p, uint64(n))
	if !ok {
		b = nil
		g.last = abi.Result{Code: abi.ErrBadArgument}
		g.last.Result.Lane = -1
		return int32(g.fail(abi.ErrBadArgument, nil))
	}
	return int32(g.apply(b))
}

// last_result writes the abi.ResultSize-byte record of the last apply.
//
//go:wasmexport last_result
func exportLastResult(out unsafe.Pointer) (code int32) {
	defer recovered(&code)
	b, ok := view(out, abi.ResultSize)
	if !ok {
		return int32(abi.ErrBadArgument)
	}
	abi.PutResult(b, &g.last)
	return 0
}

// last_error copies up to capacity bytes of the last error message (UTF-8)
// to out and returns the message's full length.
//
//go:wasmexport last_error
func exportLastError(out unsafe.Pointer, capacity uint32) (code int32) {
	defer recovered(&code)
	b, ok := view(out, uint64(min(capacity, uint32(len(g.lastErr)))))
	if !ok {
		return int32(abi.ErrBadArgument)
	}
	copy(b, g.lastErr)
	return int32(len(g.lastErr))
}

//go:wasmexport query
func exportQuery(kind uint32, in unsafe.Pointer, count uint32, blockSize int32, salt uint64, out unsafe.Pointer) (code int32) {
	// Written for the fewest Go calls, each tens of nanoseconds in
	// WebAssembly, and a small frame (BENCHMARKS.md, "Wasm kernels"): the
	// buffers are checked inline against the last query's (queryViews
	// otherwise), the sequence-hash query (the routers' query) runs here
	// rather than in a guest method, and the deferred recovery calls
	// recover only when the query did not finish (a panic before done is
	// set). The views are exact: src is 8×count bytes, dst one record.
	done := false
	defer func() {
		if !done {
			if r := recover(); r != nil {
				code = panicked(r)
			}
		}
	}()
	if kind != abi.QuerySequenceHashes { // the routers' query stays in this frame
		code = queryOther(kind, in, count, blockSize, salt, out)
		done = true
		return code
	}
	src, ok1 := within(heap.queryIn, uintptr(in), 8*uint64(count))
	dst, ok2 := within(heap.queryOut, uintptr(out), abi.QueryRecordSize)
	if !ok1 || !ok2 {
		var ok bool
		if src, dst, ok = heap.queryViews(uintptr(in), 8*uint64(count), uintptr(out), abi.QueryRecordSize); !ok {
			return int32(g.fail(abi.ErrBadArgument, nil))
		}
	}
	c, n := g.c, int(count)
	if c == nil {
		code = int32(g.query(abi.QuerySequenceHashes, src, n, 0, 0, dst))
		done = true
		return code
	}
	err := c.QuerySequenceHashes(uint64s(src, &g.hashes), &g.res)
	if uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%8 == 0 { // putQueryRecord with no Go call
		storeRecord((*[abi.QueryRecordSize / 8]uint64)(unsafe.Pointer(unsafe.SliceData(dst))), &g.res)
	} else {
		putQueryRecord(dst, &g.res)
	}
	if err != nil {
		code = int32(g.fail(abi.CodeOf(err), err))
	} else {
		code = int32(g.res.Mask)
	}
	done = true
	return code
}

// queryOther is exportQuery for every kind but sequence hashes (under its
// recovery).
func queryOther(kind uint32, in unsafe.Pointer, count uint32, blockSize int32, salt uint64, out unsafe.Pointer) int32 {
	width := uint64(8)
	switch kind {
	case abi.QueryTokens:
		width = 4
	case abi.QueryTokensWith: // count is the input's byte length
		width = 1
	}
	src, ok1 := within(heap.queryIn, uintptr(in), width*uint64(count))
	dst, ok2 := within(heap.queryOut, uintptr(out), abi.QueryRecordSize)
	if !ok1 || !ok2 {
		var ok bool
		if src, dst, ok = heap.queryViews(uintptr(in), width*uint64(count), uintptr(out), abi.QueryRecordSize); !ok {
			return int32(g.fail(abi.ErrBadArgument, nil))
		}
	}
	if kind > abi.QueryTokensWith {
		return int32(g.fail(abi.ErrBadArgument, nil))
	}
	return int32(g.query(int32(kind), src, int(count), int(blockSize), salt, dst))
}

//go:wasmexport contains
func exportContains(seqHash uint64) (code int32) {
	defer recovered(&code)
	return int32(g.contains(seqHash))
}

//go:wasmexport lane_status
func exportLaneStatus(lane int32, out unsafe.Pointer) (code int32) {
	defer recovered(&code)
	b, ok := view(out, abi.LaneStatusSize)
	if !ok {
		return int32(g.fail(abi.ErrBadArgument, nil))
	}
	return int32(g.laneStatus(lane, b))
}

//go:wasmexport lane_words
func exportLaneWords(lane int32, out unsafe.Pointer, n uint32) (code int32) {
	defer recovered(&code)
	b, ok := view(out, uint64(n))
	if !ok {
		return int32(g.fail(abi.ErrBadArgument, nil))
	}
	return int32(g.laneWords(lane, b))
}

//go:wasmexport stats
func exportStats(out unsafe.Pointer) (code int32) {
	defer recovered(&code)
	b, ok := view(out, abi.StatsSize)
	if !ok {
		return int32(g.fail(abi.ErrBadArgument, nil))
	}
	return int32(g.stats(b))
}

// salt writes ckf.Salt(lora, namespace) as u64 LE to out (8 bytes), so a
// host without XXH3 can query by tokens with an adapter or namespace.
//
//go:wasmexport salt
func exportSalt(lora unsafe.Pointer, loraLen uint32, ns unsafe.Pointer, nsLen uint32, out unsafe.Pointer) (code int32) {
	defer recovered(&code)
	l, ok1 := view(lora, uint64(loraLen))
	n, ok2 := view(ns, uint64(nsLen))
	o, ok3 := view(out, 8)
	if !ok1 || !ok2 || !ok3 {
		return int32(g.fail(abi.ErrBadArgument, nil))
	}
	binary.LittleEndian.PutUint64(o, ckf.Salt(string(l), string(n)))
	return 0
}

// live_buffers returns how many buffers alloc has handed out and free has
// not taken back (a leak check for hosts).
//
//go:wasmexport live_buffers
func exportLiveBuffers() int32 { return int32(heap.live()) }
