package abi

// Export indexes the module's exported functions (docs/abi.md §2), so every
// Go host resolves the same names once and calls them by index.
type Export int

// The module's exports, in [ExportNames] order.
const (
	ExportABIVersion Export = iota
	ExportAlloc
	ExportFree
	ExportConfigure
	ExportAssign
	ExportRetire
	ExportApply
	ExportLastResult
	ExportLastError
	ExportQuery
	ExportContains
	ExportLaneStatus
	ExportLaneWords
	ExportStats
	ExportSalt
	ExportLiveBuffers
	NumExports
)

// ExportNames are the exported functions' names, indexed by [Export].
var ExportNames = [NumExports]string{
	"abi_version", "alloc", "free", "configure", "assign", "retire", "apply", "last_result",
	"last_error", "query", "contains", "lane_status", "lane_words", "stats", "salt", "live_buffers",
}
