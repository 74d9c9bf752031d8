package client_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ckfrelay/ckfrelay/client"
)

func TestCheckRelayURL(t *testing.T) {
	for _, ok := range []string{"http://127.0.0.1:7878", "https://relay.dc-a.example:443/", "http://[::1]:7878"} {
		assert.NoError(t, client.CheckRelayURL(ok), ok)
	}
	for _, tc := range []struct{ in, want string }{
		{"127.0.0.1:7878", `write "http://127.0.0.1:7878"`},
		{"localhost:7878", `write "http://localhost:7878"`},
		{"relay.example", `write "http://relay.example"`},
		{"nats://127.0.0.1:4222", `scheme "nats"`},
		{"http://", "not an http(s) URL with a host"},
	} {
		err := client.CheckRelayURL(tc.in)
		if assert.Error(t, err, tc.in) {
			assert.Contains(t, err.Error(), tc.want, tc.in)
		}
	}
}
