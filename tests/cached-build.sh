# The one shape of every tests/*/build: hash the sources, take a lock, build
# into a temporary folder, move it into the cache, keep the newest few.
# Sourced by each build script, never executed.
#
# A build script reads like this:
#
#   . "$(dirname "${BASH_SOURCE[0]}")/../cached-build.sh"
#   cached_build_start canary "$@"      # NAME [--check|--fetch|--force|--print]
#   dir="$(go_module_dir sigs.k8s.io/gateway-api)"
#   cp "$dir"/config/... "$BUILD_TMP/crds/"
#   go_build -o "$BUILD_TMP/bin/prometheus" github.com/prometheus/prometheus/cmd/prometheus
#   cached_build_finish
#
# and prints the cached folder on stdout. The rule that makes a build work
# on a fresh machine lives here: a Go module's files are read only through
# go_module_dir, which downloads the module first. `go list -m` answers
# .Version and .Time from the module graph alone, but .Dir is empty until
# the module is in the module cache, so a script that reads .Dir directly
# works only where an earlier build happened to download it.
#
# `build --check` runs every step of the script except the Go compiles
# against an empty module cache and an empty XDG_CACHE_HOME (modules come
# from the local module cache as a proxy when it has them, else from
# GOPROXY), and builds nothing into the cache: a step that reads a module it
# did not download fails there as it would on a fresh machine. It takes
# seconds, so `cargo test` runs it for every script (tests/cluster_scripts.rs).
#
# `build --fetch` downloads what the build reads (Go modules, wheels) into
# the real caches and compiles nothing: CI fetches every tool while the
# first ones compile, so a build that starts later waits on the CPU only.
# It holds the build's lock while it fetches, so a build of the same key
# starts once the fetch is done.
#
# Compiles run at a lower priority (nice 10) than whatever started them:
# a build that a test starts runs beside the test's other trials, which
# have deadlines, and CI builds tools beside the first tiers.
# shellcheck shell=bash

CACHED_BUILD_LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cached-build.sh"

_cb_log() { printf '%s\n' "$*" >&2; }
_cb_die() { _cb_log "error: $*"; exit 1; }

# cached_build_start NAME [--check|--fetch|--force|--print]
#
# The caller may set before the call:
#   BUILD_KEY_PREFIX  text before the source hash in the folder name (default none)
#   BUILD_PRINT       subfolder printed on stdout (default: the folder itself)
#   BUILD_KEEP        how many builds to keep (default 2)
# Sets BUILD_SRC (the script's folder, also the working directory),
# BUILD_KEY, BUILD_OUT and BUILD_TMP. Exits 0, printing the folder, when the
# build is already complete (or with --print, whether or not it is).
cached_build_start() {
	BUILD_NAME=$1
	shift
	BUILD_MODE=build
	case "${1:-}" in
	--check) BUILD_MODE=check ;;
	--fetch) BUILD_MODE=fetch ;;
	--force) BUILD_MODE=force ;;
	--print) BUILD_MODE=print ;;
	"") ;;
	*) _cb_die "usage: $0 [--check|--fetch|--force|--print]" ;;
	esac
	command -v go >/dev/null || _cb_die "go not found in PATH"
	BUILD_SRC="$(cd "$(dirname "$0")" && pwd)"
	cd "$BUILD_SRC" || exit 1
	BUILD_KEEP="${BUILD_KEEP:-2}"
	if [ "$BUILD_MODE" = check ]; then
		_cb_check_env
	fi
	BUILD_KEY="${BUILD_KEY_PREFIX:-}$(_cb_source_hash)"
	_cb_root="${XDG_CACHE_HOME:-$HOME/.cache}/openmed-op/$BUILD_NAME"
	BUILD_OUT="$_cb_root/$BUILD_KEY"
	if [ "$BUILD_MODE" = print ]; then
		_cb_print
		exit 0
	fi
	mkdir -p "$_cb_root"
	# One build per key at a time; a second caller waits, then reuses it.
	exec 9>"$_cb_root/$BUILD_KEY.lock"
	flock 9
	if { [ "$BUILD_MODE" = build ] || [ "$BUILD_MODE" = fetch ]; } && [ -f "$BUILD_OUT/.complete" ]; then
		touch "$BUILD_OUT"
		_cb_print
		exit 0
	fi
	_cb_start=$SECONDS
	BUILD_TMP="$(mktemp -d "$_cb_root/.build-$BUILD_KEY.XXXXXX")"
	trap _cb_cleanup EXIT
}

# Removes what an unfinished build or a check leaves.
_cb_cleanup() {
	[ -z "${BUILD_TMP:-}" ] || rm -rf -- "$BUILD_TMP"
	if [ -n "${_cb_check_dir:-}" ]; then
		chmod -R u+w -- "$_cb_check_dir" 2>/dev/null
		rm -rf -- "$_cb_check_dir"
	fi
}

# go_module_dir MODULE: the module's folder in the module cache, downloaded
# first. The version is the one the script's go.mod selects.
go_module_dir() {
	local module=$1 version dir
	version="$(go list -m -f '{{.Version}}' "$module")" || _cb_die "$module is not in $BUILD_SRC/go.mod"
	[ -n "$version" ] || _cb_die "$module has no version in $BUILD_SRC/go.mod"
	go mod download "$module@$version" || _cb_die "cannot download $module@$version"
	dir="$(go list -m -f '{{.Dir}}' "$module")"
	[ -n "$dir" ] && [ -d "$dir" ] || _cb_die "$module@$version is not in the module cache after download"
	printf '%s\n' "$dir"
}

# go_module_version MODULE: the version go.mod selects (no download needed).
go_module_version() {
	local version
	version="$(go list -m -f '{{.Version}}' "$1")" || _cb_die "$1 is not in $BUILD_SRC/go.mod"
	[ -n "$version" ] || _cb_die "$1 has no version in $BUILD_SRC/go.mod"
	printf '%s\n' "$version"
}

# go_build ARGS...: `go build -trimpath ARGS...`, run from the current
# folder at nice 10; in --check mode only said, since a compile downloads
# what it needs; in --fetch mode `go build -n`, which downloads every
# module the compile reads and compiles nothing. The compiler writes no
# DWARF: nobody debugs these tools here (most are linked with -w, which
# drops it anyway), and writing it is a tenth of the compile.
go_build() {
	case "$BUILD_MODE" in
	check)
		_cb_log "check: would build ${*: -1}"
		return 0
		;;
	fetch)
		# -n prints the commands it would run on stderr; only a failure's
		# own message is worth showing.
		local said
		said="$(go build -n -trimpath "$@" 2>&1 >/dev/null)" || {
			printf '%s\n' "$said" | tail -n 20 >&2
			_cb_die "go build -n ${*: -1} failed"
		}
		return 0
		;;
	esac
	nice -n 10 go build -trimpath -gcflags=all=-dwarf=false "$@"
}

# cached_build_finish: marks the build complete, moves it into the cache,
# drops all but the newest BUILD_KEEP builds, prints the folder.
cached_build_finish() {
	if [ "$BUILD_MODE" = check ]; then
		_cb_log "check: $BUILD_NAME: every module-reading step works from empty caches"
		return 0
	fi
	if [ "$BUILD_MODE" = fetch ]; then
		_cb_log "fetched what $BUILD_NAME reads in $((SECONDS - _cb_start)) s"
		return 0
	fi
	touch "$BUILD_TMP/.complete"
	if [ -n "${BUILD_PRINT:-}" ] && [ -d "$BUILD_TMP/$BUILD_PRINT" ]; then
		touch "$BUILD_TMP/$BUILD_PRINT/.complete"
	fi
	rm -rf "$BUILD_OUT"
	mv "$BUILD_TMP" "$BUILD_OUT"
	BUILD_TMP=
	_cb_log "built $BUILD_NAME in $((SECONDS - _cb_start)) s: $(du -sh "$BUILD_OUT" | cut -f1) in $BUILD_OUT"
	(
		cd "$_cb_root" || exit 0
		# shellcheck disable=SC2012
		ls -1dt -- */ 2>/dev/null | tail -n +$((BUILD_KEEP + 1)) | while read -r old; do
			_cb_log "removing old build ${old%/}"
			rm -rf -- "${old%/}" "${old%/}.lock"
		done
		for lock in *.lock; do
			if [ -e "$lock" ] && [ ! -d "${lock%.lock}" ] && [ "$lock" != "$BUILD_KEY.lock" ]; then rm -f -- "$lock"; fi
		done
	)
	_cb_print
}

_cb_print() {
	if [ -n "${BUILD_PRINT:-}" ]; then
		printf '%s\n' "$BUILD_OUT/$BUILD_PRINT"
	else
		printf '%s\n' "$BUILD_OUT"
	fi
}

# Everything that influences the build, hashed into its folder name: the
# Go toolchain, the module files, Go sources, the scripts and this helper.
_cb_source_hash() {
	{
		go env GOVERSION GOOS GOARCH
		sha256sum <"$CACHED_BUILD_LIB"
		find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \
			-o -name build -o -name '*.env' \) -print | LC_ALL=C sort |
			while read -r f; do printf '%s ' "$f"; sha256sum <"$f"; done
	} | sha256sum | cut -c1-16
}

# Empty caches for --check, removed on exit. The machine's own module cache
# serves as a read-only proxy in front of GOPROXY, so the check is quick and
# works offline once the tools have been built once.
_cb_check_env() {
	local real_cache proxy
	real_cache="$(go env GOMODCACHE)"
	proxy="$(go env GOPROXY)"
	_cb_check_dir="$(mktemp -d)"
	trap _cb_cleanup EXIT
	if [ -d "$real_cache/cache/download" ]; then
		proxy="file://$real_cache/cache/download,$proxy"
	fi
	export GOMODCACHE="$_cb_check_dir/gomodcache" XDG_CACHE_HOME="$_cb_check_dir/cache" GOPROXY="$proxy"
	GOFLAGS="$(go env GOFLAGS) -modcacherw"
	export GOFLAGS
	mkdir -p "$GOMODCACHE" "$XDG_CACHE_HOME"
}
