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
	assert.Equal(t, Layout{Stream: "ckfrelay_dc-a", Subject: "ckfrelay.dc-a.frames", Bucket: "ckfrelay_dc-a_snapshot"}, l)
	l, err = For("prod", "x_1")
	require.NoError(t, err)
	assert.Equal(t, "prod.x_1.frames", l.Subject)
	for _, bad := range []struct{ prefix, pool string }{{"a.b", "p"}, {"p", "a*"}, {"p", ""}, {"sp ace", "p"}, {"p", "a>"}} {
		_, err := For(bad.prefix, bad.pool)
		assert.Error(t, err, "%+v", bad)
	}
}

func TestMsgIDAndRetention(t *testing.T) {
	assert.Equal(t, "7.42", MsgID(7, 42))
	assert.NotEqual(t, MsgID(1, 23), MsgID(12, 3))
	assert.Equal(t, 90*time.Second, Retention(30*time.Second))
	assert.Equal(t, 2*time.Minute, DuplicateWindow(Retention(time.Hour)))
	assert.Equal(t, 3*time.Second, DuplicateWindow(Retention(time.Second)))
}
