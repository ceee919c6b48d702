// Command etcd is the upstream etcd server, built from the
// go.etcd.io/etcd/server/v3 module for the end-to-end test cluster.
//
// It lives in its own Go module because etcd 3.6 and Kubernetes pin
// different versions of shared dependencies (gRPC, OpenTelemetry, the
// etcd client libraries).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
