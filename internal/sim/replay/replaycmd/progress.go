package replaycmd

import (
	"io"
	"os"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/ckfrelay/ckfrelay/internal/sim/replay"
)

// progress is a replay's progress bar with its ETA, on a terminal.
type progress struct{ bar *progressbar.ProgressBar }

// newProgress returns a bar over total requests drawn on w, or nil when w
// is not a terminal (the caller then prints a line per second, which logs
// and pipes keep readable).
func newProgress(w io.Writer, name string, total int) *progress {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return &progress{bar: progressbar.NewOptions(total,
		progressbar.OptionSetWriter(f),
		progressbar.OptionSetDescription(name),
		progressbar.OptionShowCount(),
		progressbar.OptionSetItsString("req"),
		progressbar.OptionShowIts(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionFullWidth(),
		progressbar.OptionClearOnFinish(),
	)}
}

// update moves the bar to the replay's request count.
func (p *progress) update(pr replay.Progress) { _ = p.bar.Set64(int64(pr.Requests)) }

// finish clears the bar; nil-safe.
func (p *progress) finish() {
	if p != nil {
		_ = p.bar.Finish()
	}
}
