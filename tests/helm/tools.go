//go:build tools

// Package tools pins the helm the chart tests run for real: lint, template,
// and install/upgrade/uninstall on the test control plane.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
