# Shared helpers for build, up and down. Sourced, not executed.
# shellcheck shell=bash disable=SC2034

CLUSTER_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$CLUSTER_SRC/../.." && pwd)"
# shellcheck source=versions.env
. "$CLUSTER_SRC/versions.env"

CLUSTER_CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/openmed-op/cluster"
COMPONENTS=(etcd kube-apiserver kube-controller-manager fake-kubelet)

log() { printf '%s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Everything that influences the built binaries, hashed into the cache key:
# versions, module files, Go sources, this script set and the Go toolchain.
cluster_source_hash() {
	(
		cd "$CLUSTER_SRC" || exit 1
		go env GOVERSION GOOS GOARCH
		find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \
			-o -name versions.env -o -name build \) -print | LC_ALL=C sort |
			while read -r f; do printf '%s ' "$f"; sha256sum <"$f"; done
	) | sha256sum | cut -c1-16
}

cluster_version_key() {
	echo "k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_$(cluster_source_hash)"
}

cluster_bin_dir() {
	echo "$CLUSTER_CACHE_ROOT/$(cluster_version_key)/bin"
}
