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

