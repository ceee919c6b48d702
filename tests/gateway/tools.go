//go:build tools

// The Envoy Gateway controller the workload's data plane runs; this file
// only pins the module (see build).
package tools

import (
	_ "github.com/envoyproxy/gateway/cmd/envoy-gateway"
)
