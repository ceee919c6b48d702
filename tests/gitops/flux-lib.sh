# Process helpers for flux-up and flux-down. Sourced, not executed, after
# tests/cluster/lib.sh and state.sh (log, die, _pid_running, _pid_exe) and
# cluster_init_dir, which sets DIR.
# shellcheck shell=bash

FLUX_COMPONENTS=(gitserver source-controller kustomize-controller)
FLUX_CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/openmed-op/flux"

# flux_pid NAME: prints the pid in DIR/flux/NAME.pid if that process is
# alive and still is our NAME binary (from the Flux tool cache) started for
# this DIR (DIR on its command line, or its KUBECONFIG DIR's); removes the
# pid file of a process that is gone.
flux_pid() {
	local f="$DIR/flux/$1.pid" pid exe try
	[ -f "$f" ] || return 1
	pid="$(cat "$f")"
	if ! [[ "$pid" =~ ^[0-9]+$ ]] || ! _pid_running "$pid"; then
		rm -f "$f"
		return 1
	fi
	# Alive: ours when it runs our binary and its command line or
	# environment names this DIR. Those reads once said no for a live Git
	# server on a loaded machine (read mid-exec), which forgot it and left
	# it running with no record; so they are read again before the answer
	# is no, and the record of a live process is kept either way (a stale
	# one is harmless: nothing is stopped unless it is ours, and the next
	# start writes it over).
	for try in 1 2 3; do
		if exe="$(_pid_exe "$pid")" &&
			[ "$(basename "$exe")" = "$1" ] && [[ "$exe" == "$FLUX_CACHE_ROOT"/* ]] &&
			{ _proc_list_has "$pid" cmdline -F "$DIR/" ||
				_proc_list_has "$pid" environ -xF "KUBECONFIG=$DIR/kubeconfig"; }; then
			echo "$pid"
			return 0
		fi
		[ "$try" = 3 ] || sleep 0.2
	done
	return 1
}

flux_alive() { # NAME: the recorded process still runs
	flux_pid "$1" >/dev/null
}

# flux_launch NAME BINARY ARGS...: cluster_launch (tests/cluster/state.sh)
# with the pid in DIR/flux/NAME.pid and the output in DIR/logs/flux-NAME.log.
flux_launch() {
	LAUNCH_PID_DIR="$DIR/flux" LAUNCH_LOG_PREFIX=flux- cluster_launch "$@"
}

# flux_stop NAME: SIGTERM, then SIGKILL after 15 s; only a recorded process
# that flux_pid still recognises.
flux_stop() {
	local pid i
	pid="$(flux_pid "$1")" || { rm -f "$DIR/flux/$1.pid"; return 0; }
	log "stopping $1 (pid $pid)"
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 150; i++)); do
		_pid_running "$pid" || break
		sleep 0.1
	done
	if _pid_running "$pid"; then
		log "$1 (pid $pid) did not stop within 15s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
		for ((i = 0; i < 50; i++)); do _pid_running "$pid" || break; sleep 0.1; done
	fi
	rm -f "$DIR/flux/$1.pid" "$DIR/flux/$1.cmd"
}

# flux_port_free PORT: nothing listens on PORT.
flux_port_free() {
	local ports
	ports="$(_listening_ports)"
	! grep -qx -- "$1" <<<"$ports"
}

# flux_choose_port TAKEN...: prints a port nothing listens on, below the
# ephemeral range, and not among TAKEN.
flux_choose_port() {
	local busy candidate
	busy=" $(_listening_ports | tr '\n' ' ') $* "
	while :; do
		candidate=$((20000 + RANDOM % 12000))
		[[ "$busy" == *" $candidate "* ]] || break
	done
	echo "$candidate"
}
