//go:build tools

// Package tools pins KEDA, which the autoscaling tests run for real, out of
// cluster against the test control plane: the operator (which turns
// ScaledObjects into HorizontalPodAutoscalers and computes the scalers'
// metrics) and its metrics adapter (the external.metrics.k8s.io API server
// the HPA controller asks). Their CRDs are copied from the same module (see
// build).
package tools

import (
	_ "github.com/kedacore/keda/v2/cmd/adapter"
	_ "github.com/kedacore/keda/v2/cmd/operator"
)
