package workload

import "math/rand/v2"

// SyntheticConfig shapes a synthetic chat workload: a few shared system
// prompts with Zipf popularity, and multi-turn conversations that extend their
// own previous request.
type SyntheticConfig struct {
	SystemPrompts  int     // distinct system prompts, ≥ 1
	PromptBlocks   int     // blocks per system prompt, ≥ 1
	ZipfS          float64 // Zipf exponent (> 1) over system prompts
	Conversations  int     // conversations kept open at once, ≥ 1
	TurnBlocks     int     // new blocks a turn adds, ≥ 1
	MaxTurns       int     // turns before a conversation ends, ≥ 1
	ContinueChance float64 // probability a request continues an open conversation
	Seed           uint64
}

// DefaultSyntheticConfig is the demo's workload.
func DefaultSyntheticConfig() SyntheticConfig {
	return SyntheticConfig{
		SystemPrompts: 64, PromptBlocks: 8, ZipfS: 1.2,
		Conversations: 512, TurnBlocks: 4, MaxTurns: 8,
		ContinueChance: 0.7, Seed: 1,
	}
}

// Synthetic generates requests. Block ids below SystemPrompts*PromptBlocks
// belong to system prompts; later ids are fresh conversation blocks.
type Synthetic struct {
	cfg    SyntheticConfig
	rng    *rand.Rand
	zipf   *rand.Zipf
	nextID uint64
	convs  []conversation
}

type conversation struct {
	ids   []uint64
	turns int
}

// NewSynthetic returns a generator; invalid fields are raised to their minimum.
func NewSynthetic(cfg SyntheticConfig) *Synthetic {
	cfg.SystemPrompts = max(cfg.SystemPrompts, 1)
	cfg.PromptBlocks = max(cfg.PromptBlocks, 1)
	cfg.Conversations = max(cfg.Conversations, 1)
	cfg.TurnBlocks = max(cfg.TurnBlocks, 1)
	cfg.MaxTurns = max(cfg.MaxTurns, 1)
	if cfg.ZipfS <= 1 {
		cfg.ZipfS = 1.01
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9E3779B97F4A7C15))
	return &Synthetic{
		cfg:    cfg,
		rng:    rng,
		zipf:   rand.NewZipf(rng, cfg.ZipfS, 1, uint64(cfg.SystemPrompts-1)),
		nextID: uint64(cfg.SystemPrompts * cfg.PromptBlocks),
	}
}

// Next returns the next request. Its HashIDs are owned by the caller.
func (g *Synthetic) Next() Request {
	var c *conversation
	if len(g.convs) > 0 && g.rng.Float64() < g.cfg.ContinueChance {
		i := g.rng.IntN(len(g.convs))
		c = &g.convs[i]
	} else {
		if len(g.convs) >= g.cfg.Conversations {
			i := g.rng.IntN(len(g.convs))
			g.convs[i] = g.convs[len(g.convs)-1]
			g.convs = g.convs[:len(g.convs)-1]
		}
		p := g.zipf.Uint64()
		ids := make([]uint64, 0, g.cfg.PromptBlocks+g.cfg.TurnBlocks*g.cfg.MaxTurns)
		for b := range g.cfg.PromptBlocks {
			ids = append(ids, p*uint64(g.cfg.PromptBlocks)+uint64(b))
		}
		g.convs = append(g.convs, conversation{ids: ids})
		c = &g.convs[len(g.convs)-1]
	}
	for range g.cfg.TurnBlocks {
		c.ids = append(c.ids, g.nextID)
		g.nextID++
	}
	c.turns++
	req := Request{HashIDs: append([]uint64(nil), c.ids...), InputLength: int64(len(c.ids) * MooncakeBlockTokens)}
	if c.turns >= g.cfg.MaxTurns {
		*c = g.convs[len(g.convs)-1]
		g.convs = g.convs[:len(g.convs)-1]
	}
	return req
}
