//go:build tools

// Package tools pins the Flux controllers the GitOps tests run for real,
// out of cluster against the test control plane: source-controller (which
// fetches Git repositories and serves their artifacts) and
// kustomize-controller (which applies them). Their CRDs are copied from the
// same modules (see build).
package tools

import (
	_ "github.com/fluxcd/kustomize-controller"
	_ "github.com/fluxcd/source-controller"
)
