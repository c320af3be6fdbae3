# Shared by e2e/cluster/{up,down,status}: paths, logging and process helpers.
# shellcheck shell=bash

E2E_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
E2E_STATE=${COJOB_E2E_STATE:-/var/lib/cojob-e2e}
E2E_LOGS=${COJOB_E2E_LOGS:-$E2E_STATE/logs}
E2E_CACHE=${COJOB_E2E_CACHE:-$HOME/.cache/cojob-e2e}
E2E_PKI=$E2E_STATE/pki
E2E_RUN=$E2E_STATE/run
E2E_NODE=${COJOB_E2E_NODE:-cojob-e2e}
E2E_KUBECONFIG=$E2E_STATE/kubeconfig
E2E_CRI_SOCKET=/run/cojob-e2e/containerd.sock
export COJOB_E2E_STATE=$E2E_STATE COJOB_E2E_LOGS=$E2E_LOGS COJOB_E2E_CACHE=$E2E_CACHE

e2e_log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
e2e_die() {
	printf '[%s] ERROR: %s\n' "$(date +%H:%M:%S)" "$*" >&2
	exit 1
}

# e2e_running NAME: true if the pid in run/NAME.pid is alive.
e2e_running() {
	local pidfile=$E2E_RUN/$1.pid
	[[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

# e2e_start NAME CMD...: starts CMD in the background with its log in logs/NAME.log, unless it
# already runs.
e2e_start() {
	local name=$1
	shift
	mkdir -p "$E2E_RUN" "$E2E_LOGS"
	if e2e_running "$name"; then
		e2e_log "$name already running (pid $(cat "$E2E_RUN/$name.pid"))"
		return 0
	fi
	e2e_log "starting $name (log: $E2E_LOGS/$name.log)"
	nohup setsid "$@" >>"$E2E_LOGS/$name.log" 2>&1 </dev/null &
	echo $! >"$E2E_RUN/$name.pid"
}

# e2e_wait WHAT SECONDS CMD...: retries CMD every second until it succeeds.
e2e_wait() {
	local what=$1 secs=$2
	shift 2
	local i
	for ((i = 0; i < secs; i++)); do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		sleep 1
	done
	e2e_log "timed out after ${secs}s waiting for $what"
	return 1
}

# e2e_stop NAME: stops the process of run/NAME.pid (TERM, then KILL after 15 s).
e2e_stop() {
	local name=$1 pidfile=$E2E_RUN/$1.pid pid i
	[[ -f $pidfile ]] || return 0
	pid=$(cat "$pidfile")
	if kill -0 "$pid" 2>/dev/null; then
		e2e_log "stopping $name (pid $pid)"
		kill -TERM "$pid" 2>/dev/null || true
		for ((i = 0; i < 15; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 1
		done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$pidfile"
}

# The control-plane components, in start order.
E2E_COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet)
