//go:build tools

// Package tools pins the kustomize command built for the tests.
package tools

import _ "sigs.k8s.io/kustomize/kustomize/v5"
