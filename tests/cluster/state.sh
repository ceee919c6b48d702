# Process and state helpers for up and down. Sourced, not executed.
# shellcheck shell=bash disable=SC2034

MARKER=.openmed-op-cluster  # marks a folder created by up (checked by down --purge)
NODE_NAME=fake-node
SERVICE_CIDR=10.96.0.0/16
SERVICE_API_IP=10.96.0.1
POD_CIDR=10.244.0.0/16
# The node's address on the pod network (the first of POD_CIDR): where
# process pods reach this machine's services, the API server among them.
POD_GATEWAY=10.244.0.1

# cluster_init_dir [DIR]: sets DIR to an absolute path.
cluster_init_dir() {
	DIR="${1:-$REPO_ROOT/target/cluster}"
	case "$DIR" in /*) ;; *) DIR="$PWD/$DIR" ;; esac
	DIR="${DIR%/}"
}

# _pid_running PID: PID has not finished exiting. A zombie (exited, not yet
# reaped by its parent) has; a process still exiting has not, and may still
# hold its ports, even after its /proc/PID/exe link is gone.
_pid_running() {
	[ -e "/proc/$1" ] && [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]
}

# _pid_exe PID: prints the binary PID runs; fails once it is exiting.
# _proc_list_has PID FILE GREP-FLAGS PATTERN: /proc/PID/FILE (NUL-separated:
# cmdline, environ) has an entry matching PATTERN. The file is read whole
# before matching: piping it into `grep -q` under pipefail turns a match into
# a miss whenever grep exits at the match before the writer is done (SIGPIPE).
_proc_list_has() {
	local entries
	entries="$(tr '\0' '\n' <"/proc/$1/$2" 2>/dev/null)" || return 1
	grep -q "$3" -- "$4" <<<"$entries"
}

_pid_exe() {
	local exe
	_pid_running "$1" && exe="$(readlink "/proc/$1/exe" 2>/dev/null)" || return 1
	echo "${exe% (deleted)}"
}

# cluster_pid NAME: prints the pid recorded for NAME if that process is alive
# and still is our NAME binary started for this DIR; removes a stale pid file.
cluster_pid() {
	local f="$DIR/pids/$1.pid" pid exe
	[ -f "$f" ] || return 1
	pid="$(cat "$f")"
	if [[ "$pid" =~ ^[0-9]+$ ]] && exe="$(_pid_exe "$pid")"; then
		if [ "$(basename "$exe")" = "$1" ] && [[ "$exe" == "$CLUSTER_CACHE_ROOT"/* ]] &&
			_proc_list_has "$pid" cmdline -F "$DIR/"; then
			echo "$pid"
			return 0
		fi
	fi
	rm -f "$f"
	return 1
}

# cluster_running_bin_dir: the bin folder the running kube-apiserver came from.
cluster_running_bin_dir() {
	local pid exe
	pid="$(cluster_pid kube-apiserver)" || return 0
	exe="$(_pid_exe "$pid")" && dirname "$exe"
}

cluster_stop() { # NAME [GRACE_SECONDS]
	local pid i grace="${2:-15}"
	pid="$(cluster_pid "$1")" || { rm -f "$DIR/pids/$1.pid"; return 0; }
	log "stopping $1 (pid $pid)"
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < grace * 10; i++)); do
		_pid_running "$pid" || break
		sleep 0.1
	done
	if _pid_running "$pid"; then
		log "$1 (pid $pid) did not stop within ${grace}s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
		for ((i = 0; i < 50; i++)); do _pid_running "$pid" || break; sleep 0.1; done
	fi
	rm -f "$DIR/pids/$1.pid"
}

cluster_stop_all() {
	local i
	for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
		cluster_stop "${COMPONENTS[i]}"
	done
	cluster_sweep_netns
}

# cluster_netns_prefix: the prefix of the network namespaces the kubelet
# makes for this cluster's process pods (one cluster per API server port).
cluster_netns_prefix() { echo "fk${APISERVER_PORT:?}"; }

# cluster_sweep_netns: removes the network namespaces a killed kubelet left
# behind, and any process still inside them. A kubelet that stops cleanly
# leaves none.
cluster_sweep_netns() {
	[ -n "${APISERVER_PORT:-}" ] && [ -d /run/netns ] || return 0
	local prefix ns pid
	prefix="$(cluster_netns_prefix)"
	for ns in /run/netns/"$prefix"-*; do
		[ -e "$ns" ] || continue
		ns="${ns##*/}"
		for pid in $(ip netns pids "$ns" 2>/dev/null); do
			kill -KILL "$pid" 2>/dev/null || true
		done
		ip netns del "$ns" 2>/dev/null || log "could not remove network namespace $ns"
	done
}

# cluster_launch NAME BINARY ARGS...: starts a detached process (own session,
# stdin from /dev/null, output appended to DIR/logs/NAME.log, no inherited
# descriptors) that outlives this script, and records its pid.
# LAUNCH_PID_DIR (default DIR/pids) and LAUNCH_LOG_PREFIX (default none)
# let another set of processes (Flux's, tests/gitops/flux-lib.sh) keep its
# own records.
#
# It returns once that pid runs the NAME binary (or has exited). Until then
# the pid is still a subshell, or a wrapper that execs the binary later, and
# cluster_pid would take it for a dead component and forget it: on a busy
# machine that failed startups and left the component running, unrecorded.
cluster_launch() {
	local name=$1 pid_dir="${LAUNCH_PID_DIR:-$DIR/pids}" pid exe deadline
	local log_file="$DIR/logs/${LAUNCH_LOG_PREFIX:-}$1.log"
	shift
	printf '\n=== %s starting %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$name" >>"$log_file"
	(
		for fd in "/proc/$BASHPID/fd/"*; do
			fd="${fd##*/}"
			if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
		done
		exec setsid "$@"
	) </dev/null >>"$log_file" 2>&1 &
	pid=$!
	echo "$pid" >"$pid_dir/$name.pid"
	# The command line, so `restart` can start the same process again.
	printf '%s\0' "$@" >"$pid_dir/$name.cmd"
	deadline=$((SECONDS + 60))
	while exe="$(_pid_exe "$pid")"; do
		[ "$(basename "$exe")" != "$name" ] || return 0
		if [ "$SECONDS" -ge "$deadline" ]; then
			log "$name (pid $pid) is still $exe after 60s; stopping it"
			kill -KILL "$pid" 2>/dev/null || true
			return 1
		fi
		sleep 0.05
	done
	# Exited before or right after exec: the caller's wait reports it with the log.
	return 0
}

cluster_alive() { # NAME: the recorded process still runs
	cluster_pid "$1" >/dev/null
}

# cluster_fail MESSAGE: prints the message and the tail of every log.
cluster_fail() {
	local c
	log "error: $1"
	for c in "${COMPONENTS[@]}"; do
		[ -f "$DIR/logs/$c.log" ] || continue
		log "---- last lines of $DIR/logs/$c.log"
		tail -n 25 "$DIR/logs/$c.log" >&2
	done
}

_curl() { # PATH: GET on the API server as admin, whitespace removed
	curl -sS --max-time 5 --cacert "$DIR/pki/ca.crt" --cert "$DIR/pki/admin.crt" --key "$DIR/pki/admin.key" \
		"https://127.0.0.1:$APISERVER_PORT$1" | tr -d ' \t\n'
}

cluster_etcd_healthy() {
	local body
	body="$(curl -fsS --max-time 5 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null)" || return 1
	[[ "$body" == *'"health":"true"'* ]]
}
cluster_apiserver_ready() {
	[ "$(_curl /readyz 2>/dev/null)" = ok ]
}
cluster_controller_manager_healthy() {
	[ "$(curl -sS --max-time 5 -k "https://127.0.0.1:$CONTROLLER_MANAGER_PORT/healthz" 2>/dev/null)" = ok ]
}
cluster_default_sa_exists() {
	local body
	body="$(_curl /api/v1/namespaces/default/serviceaccounts/default 2>/dev/null)" || return 1
	[[ "$body" == *'"kind":"ServiceAccount"'* ]]
}
cluster_node_ready() {
	local body
	body="$(_curl "/api/v1/nodes/$NODE_NAME" 2>/dev/null)" || return 1
	[[ "$body" == *'"type":"Ready","status":"True"'* ]]
}

# cluster_wait_for DEADLINE DESCRIPTION CHECK COMPONENTS...: waits until CHECK
# succeeds; fails early if one of COMPONENTS exits, or at DEADLINE (SECONDS).
cluster_wait_for() {
	local deadline=$1 what=$2 check=$3 c
	shift 3
	while ! "$check"; do
		for c in "$@"; do
			cluster_alive "$c" || { cluster_fail "$c exited while waiting for $what"; return 1; }
		done
		if [ "$SECONDS" -ge "$deadline" ]; then
			cluster_fail "timed out waiting for $what"
			return 1
		fi
		sleep 0.5
	done
}

# cluster_wait_ready DEADLINE: the whole cluster is usable.
cluster_wait_ready() {
	local d=$1
	cluster_wait_for "$d" "etcd health" cluster_etcd_healthy etcd &&
		cluster_wait_for "$d" "kube-apiserver /readyz" cluster_apiserver_ready etcd kube-apiserver &&
		cluster_wait_for "$d" "kube-controller-manager /healthz" cluster_controller_manager_healthy "${COMPONENTS[@]}" &&
		cluster_wait_for "$d" "the default ServiceAccount" cluster_default_sa_exists "${COMPONENTS[@]}" &&
		cluster_wait_for "$d" "node $NODE_NAME to be Ready" cluster_node_ready "${COMPONENTS[@]}"
}

_listening_ports() {
	# Local ports of listening TCP sockets (state 0A), in decimal.
	local _sl local_addr _rem state _rest
	cat /proc/net/tcp /proc/net/tcp6 2>/dev/null |
		while read -r _sl local_addr _rem state _rest; do
			if [ "$state" = 0A ]; then echo $((16#${local_addr##*:})); fi
		done | sort -u
}

# cluster_choose_ports: reuses DIR/ports when all its ports are free, else
# picks new free ports (below the ephemeral range) and records them.
cluster_choose_ports() {
	local busy p ok=1 ports=() candidate
	busy=" $(_listening_ports | tr '\n' ' ') "
	if [ -f "$DIR/ports" ]; then
		# shellcheck source=/dev/null
		. "$DIR/ports"
		for p in "${ETCD_PORT:-}" "${ETCD_PEER_PORT:-}" "${APISERVER_PORT:-}" "${CONTROLLER_MANAGER_PORT:-}"; do
			if [ -z "$p" ] || [[ "$busy" == *" $p "* ]]; then ok=0; fi
		done
		[ "$ok" = 0 ] || return 0
		log "a port recorded in $DIR/ports is taken; choosing new ports"
	fi
	while [ ${#ports[@]} -lt 4 ]; do
		candidate=$((20000 + RANDOM % 12000))
		[[ "$busy" == *" $candidate "* ]] && continue
		[[ " ${ports[*]} " == *" $candidate "* ]] && continue
		ports+=("$candidate")
	done
	cat >"$DIR/ports" <<-EOF
	# Ports of the test cluster in this folder, chosen by up; reused on restart.
	ETCD_PORT=${ports[0]}
	ETCD_PEER_PORT=${ports[1]}
	APISERVER_PORT=${ports[2]}
	CONTROLLER_MANAGER_PORT=${ports[3]}
	EOF
}
