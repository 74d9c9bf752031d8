#!/usr/bin/env bash
# Generates wire/kvrelay/kvrelaypb from relay.proto under the module root
# given as $1 (default: this checkout), with protoc from Debian's
# protobuf-compiler and the protoc plugins pinned in internal/tools/go.mod.
# Used by `make proto` (in place) and `make proto-check` (into a temp dir).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
out=${1:-$root}
GO=${GO:-go}
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
"$GO" -C "$root/internal/tools" build -o "$bin/" tool
mkdir -p "$out/wire/kvrelay/kvrelaypb"
protoc -I "$root/wire/kvrelay/proto" \
	--plugin=protoc-gen-go="$bin/protoc-gen-go" \
	--plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
	--go_out="$out" --go_opt=module=github.com/ckfrelay/ckfrelay \
	--go-grpc_out="$out" --go-grpc_opt=module=github.com/ckfrelay/ckfrelay \
	dynamo/kvrelay/v1/relay.proto
