module openmed-op/tests/monitoring-crds

go 1.26.0

// Only its CRDs are read (./build copies them); nothing is compiled.
require github.com/prometheus-operator/prometheus-operator v0.94.1
