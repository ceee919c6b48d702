// Command kstatus prints the kstatus verdict (what Flux's health checks and
// kpt's live apply use) for one object read as JSON from stdin:
//
//	kubectl get omm x -o json | kstatus
//	Current: Resource is Ready
package main

import (
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(2)
	}
	// The unstructured decoder keeps integers as int64, as the API
	// machinery expects (encoding/json would make them float64).
	object := &unstructured.Unstructured{}
	if err := object.UnmarshalJSON(data); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: stdin is not a Kubernetes object:", err)
		os.Exit(2)
	}
	result, err := status.Compute(object)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
	fmt.Printf("%s: %s\n", result.Status, result.Message)
}
