//go:build tools

// Package tools pins what the canary tests run for real: the Gateway API
// CRDs (copied from the module, standard channel), Prometheus, and promtool
// (which unit-tests the alerts of deploy/monitoring).
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
	_ "sigs.k8s.io/gateway-api/apis/v1"
)
