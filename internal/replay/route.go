package replay

// Deepest is the pure-affinity choice: the index with the deepest reported
// prefix, ties to the one with the least load, then the lowest index. A
// negative depth (a lane that gave no answer) never beats an answer. It is
// the router's pick the [Scorer] checks for agreement in replay and in
// `relay demo`, and the [Affinity] placement policy.
func Deepest(depths []int, load []uint64) int {
	best := 0
	for d := range depths {
		if depths[d] > depths[best] || (depths[d] == depths[best] && load[d] < load[best]) {
			best = d
		}
	}
	return best
}
