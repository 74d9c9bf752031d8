package natsjs

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFor(t *testing.T) {
	l, err := For("", "dc-a")
	require.NoError(t, err)
	assert.Equal(t, Layout{Stream: "ckfrelay_dc-a", Subject: "ckfrelay.dc-a.frames", Pointer: "ckfrelay.dc-a.snapshot", Bucket: "ckfrelay_dc-a_snapshot"}, l)
	l, err = For("prod", "x_1")
	require.NoError(t, err)
	assert.Equal(t, "prod.x_1.frames", l.Subject)
	for _, bad := range []struct{ prefix, pool string }{{"a.b", "p"}, {"p", "a*"}, {"p", ""}, {"sp ace", "p"}, {"p", "a>"}} {
		_, err := For(bad.prefix, bad.pool)
		assert.Error(t, err, "%+v", bad)
	}
}

func TestMsgIDAndRetention(t *testing.T) {
	assert.Equal(t, "7.42.3", MsgID(7, 42, 3))
	assert.NotEqual(t, MsgID(1, 23, 1), MsgID(12, 3, 1))
	assert.NotEqual(t, MsgID(1, 2, 34), MsgID(1, 23, 4))
	assert.Equal(t, 90*time.Second, Retention(30*time.Second))
	assert.Equal(t, 2*time.Minute, DuplicateWindow(Retention(time.Hour)))
	assert.Equal(t, 3*time.Second, DuplicateWindow(Retention(time.Second)))
}

func TestSnapshotObjectNamesAndPointer(t *testing.T) {
	assert.Equal(t, "snapshot-0000000500000007", SnapshotObjectName(5<<32|7))
	assert.Less(t, SnapshotObjectName(0xff), SnapshotObjectName(0x100), "names sort as incarnations")
	inc, ok := SnapshotObjectIncarnation(SnapshotObjectName(1<<63 + 9))
	assert.True(t, ok)
	assert.Equal(t, uint64(1<<63+9), inc)
	for _, bad := range []string{SnapshotObject, "snapshot-", "snapshot-12", "snapshot-000000000000000g", "x-0000000000000001", "snapshot-00000000000000001"} {
		_, ok := SnapshotObjectIncarnation(bad)
		assert.False(t, ok, bad)
	}

	p := Pointer{Object: SnapshotObjectName(9), Sequence: 42, Incarnation: 9, StreamSequence: 77}
	got, err := ParsePointer(p.Header())
	require.NoError(t, err)
	assert.Equal(t, p, got)
	for name, h := range map[string]map[string][]string{
		"another incarnation's object": Pointer{Object: SnapshotObjectName(8), Incarnation: 9}.Header(),
		"a free name":                  Pointer{Object: "../../x", Incarnation: 9}.Header(),
		"the legacy object":            Pointer{Object: SnapshotObject, Incarnation: 9}.Header(),
		"no stream sequence":           {MetaObject: {SnapshotObjectName(9)}, MetaSequence: {"1"}, MetaIncarnation: {"9"}},
		"two values":                   {MetaObject: {SnapshotObjectName(9)}, MetaSequence: {"1", "2"}, MetaIncarnation: {"9"}, MetaStreamSequence: {"1"}},
		"negative":                     {MetaObject: {SnapshotObjectName(9)}, MetaSequence: {"-1"}, MetaIncarnation: {"9"}, MetaStreamSequence: {"1"}},
	} {
		_, err := ParsePointer(h)
		assert.Error(t, err, name)
	}
}
