//go:build tools

// Package tools pins the commands built for the tests: kustomize, and
// gojq, the jq implementation Argo CD evaluates ignoreDifferences
// jqPathExpressions with.
package tools

import (
	_ "github.com/itchyny/gojq/cmd/gojq"
	_ "sigs.k8s.io/kustomize/kustomize/v5"
)
