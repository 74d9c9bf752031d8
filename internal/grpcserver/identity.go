package grpcserver

import (
	"github.com/ckfrelay/ckfrelay/ckf"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay"
	"github.com/ckfrelay/ckfrelay/wire/kvrelay/kvrelaypb"
)

// The subscription key's conversion is the contract's, shared with the
// router (wire/kvrelay): one mapping of ckf's identity to the wire, so the
// relay and its routers cannot disagree about a key.
var (
	producerToWire   = kvrelay.ProducerToWire
	producerFromWire = kvrelay.ProducerFromWire
)

// poolIDToWire is a pool's KvPoolId (topology members and serving pools name
// pools by it).
func poolIDToWire(p ckf.PoolID) *kvrelaypb.KvPoolId {
	return producerToWire(ckf.ProducerIdentity{Pool: p}).GetPoolId()
}
