// Nativeconsumer runs a conformance scenario (internal/integration/conformance's JSON
// form: a manifest and steps; expected results are ignored) on the native Go
// consumer and prints each step's result as one JSON array, in the shape of
// the scenario's "want" objects. The JavaScript router's tests (js/test) use
// it to check that the module under Node answers exactly as the Go consumer
// does on the same frames.
//
//	nativeconsumer < scenario.json > results.json
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/ckfrelay/ckfrelay/client"
	"github.com/ckfrelay/ckfrelay/internal/integration/conformance"
	"github.com/ckfrelay/ckfrelay/wasm/abi"
)

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "nativeconsumer:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	var s conformance.Scenario
	if err := json.NewDecoder(in).Decode(&s); err != nil {
		return err
	}
	m, err := abi.DecodeManifest(s.Manifest)
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	c, err := client.NewNative(m)
	if err != nil {
		return err
	}
	results := make([]conformance.Want, len(s.Steps))
	for i := range s.Steps {
		if results[i], err = conformance.Exec(c, &s.Steps[i]); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
	}
	return json.NewEncoder(out).Encode(results)
}
