package zmq

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// logLimiter thins a source's recovery log — sequence gaps, degraded
// resets, replay outcomes, restarts, silences, redials — to at most one line
// per message per rejectLogEvery, as rejections are. A line written after
// others of its kind were held back carries how many ("suppressed"). Only
// the log is thinned: Status counts every occurrence exactly. A peer that
// sends a gap on every message made ~200,000 WARN lines a second without it.
type logLimiter struct {
	mu    sync.Mutex
	kinds map[string]*logKind // keyed by message: a fixed set of constants
}

type logKind struct {
	last       time.Time
	suppressed uint64
}

// log writes msg at level unless a line with the same msg was written less
// than rejectLogEvery ago.
func (l *logLimiter) log(log *slog.Logger, level slog.Level, msg string, args ...any) {
	now := time.Now()
	l.mu.Lock()
	if l.kinds == nil {
		l.kinds = map[string]*logKind{}
	}
	k := l.kinds[msg]
	if k == nil {
		k = &logKind{}
		l.kinds[msg] = k
	}
	if !k.last.IsZero() && now.Sub(k.last) < rejectLogEvery {
		k.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := k.suppressed
	k.last, k.suppressed = now, 0
	l.mu.Unlock()
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	log.Log(context.Background(), level, msg, args...)
}
