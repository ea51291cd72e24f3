#!/usr/bin/env bash
# A 3-node RabbitMQ cluster on this one host, for tests/cluster and benchmarks/soak.py.
# It never touches the machine's own broker (rabbit@localhost, 5672, /etc/rabbitmq).
#
#   .ci/rabbitmq-cluster.sh start          # start missing nodes, join them (idempotent)
#   .ci/rabbitmq-cluster.sh stop           # stop every node and delete its data
#   .ci/rabbitmq-cluster.sh status         # cluster_status as seen by the first live node
#   .ci/rabbitmq-cluster.sh url            # the broker URL listing all three nodes
#   .ci/rabbitmq-cluster.sh pid N          # OS pid of node N's Erlang VM (1..3)
#   .ci/rabbitmq-cluster.sh ctl N ARGS...  # rabbitmqctl -n prN@localhost ARGS (its cookie)
#
# Node N (1..3) is prN@localhost with AMQP on 127.0.0.1:568N and Erlang distribution on
# 2568N (RABBITMQ_DIST_PORT); no management listener (no plugins are enabled). Each node
# has its own config, data, log and pid file under $PODRACER_CLUSTER_DIR (default
# /tmp/podracer-rabbitmq-cluster); all share one Erlang cookie in $DIR/home, which is
# HOME for the nodes and for rabbitmqctl. The config sets cluster_partition_handling =
# pause_minority: a node cut off from the other two pauses (closes its client
# connections) until it sees them again, so clients move to the majority.
#
# `start` also restarts a node that died (e.g. SIGKILLed by a test): its data directory
# remembers the cluster, and it rejoins by itself.
set -euo pipefail

DIR=${PODRACER_CLUSTER_DIR:-/tmp/podracer-rabbitmq-cluster}
SBIN=${RABBITMQ_SBIN:-/usr/lib/rabbitmq/bin}
NODES=(1 2 3)
HOSTNAME_PART=localhost
WAIT_S=${PODRACER_CLUSTER_WAIT_S:-180}

node() { echo "pr$1@$HOSTNAME_PART"; }
amqp_port() { echo $((5680 + $1)); }
dist_port() { echo $((25680 + $1)); }

node_env() {
    # the environment of node $1's server and of every rabbitmqctl call aimed at it
    local n=$1 base="$DIR/pr$1"
    export HOME="$DIR/home"
    export RABBITMQ_CONF_ENV_FILE="$DIR/rabbitmq-env.conf"
    export RABBITMQ_NODENAME
    RABBITMQ_NODENAME=$(node "$n")
    export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    export RABBITMQ_NODE_PORT
    RABBITMQ_NODE_PORT=$(amqp_port "$n")
    export RABBITMQ_DIST_PORT
    RABBITMQ_DIST_PORT=$(dist_port "$n")
    export RABBITMQ_CONFIG_FILE="$base/rabbitmq.conf"
    export RABBITMQ_MNESIA_BASE="$base/mnesia"
    export RABBITMQ_LOG_BASE="$base/log"
    export RABBITMQ_PID_FILE="$base/pid"
    export RABBITMQ_ENABLED_PLUGINS_FILE="$base/enabled_plugins"
    export ERL_EPMD_ADDRESS=127.0.0.1
}

ctl() {
    local n=$1
    shift
    (node_env "$n"; "$SBIN/rabbitmqctl" -n "$(node "$n")" "$@")
}

prepare() {
    mkdir -p "$DIR/home"
    if [ ! -s "$DIR/home/.erlang.cookie" ]; then
        # its own cookie: the machine's broker (/var/lib/rabbitmq/.erlang.cookie) is a
        # different cluster and must never be joined
        head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$DIR/home/.erlang.cookie"
        chmod 400 "$DIR/home/.erlang.cookie"
    fi
    : > "$DIR/rabbitmq-env.conf"
    for n in "${NODES[@]}"; do
        local base="$DIR/pr$n"
        mkdir -p "$base/mnesia" "$base/log"
        echo "[]." > "$base/enabled_plugins"
        cat > "$base/rabbitmq.conf" <<EOF
listeners.tcp.1 = 127.0.0.1:$(amqp_port "$n")
cluster_partition_handling = pause_minority
loopback_users = none
log.file.level = info
EOF
    done
}

running() {
    # the node answers and its rabbit app runs (one CLI call: seconds on a busy machine)
    ctl "$1" -q -t 10 eval 'rabbit:is_running().' 2>/dev/null | grep -qx true
}

vm_alive() {
    local pid
    pid=$(cat "$DIR/pr$1/pid" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

start_node() {
    local n=$1
    (
        node_env "$n"
        rm -f "$RABBITMQ_PID_FILE"
        cd "$DIR"
        setsid "$SBIN/rabbitmq-server" >>"$RABBITMQ_LOG_BASE/console.log" 2>&1 </dev/null &
    )
    echo "rabbitmq-cluster: starting $(node "$n") (AMQP 127.0.0.1:$(amqp_port "$n"))"
}

await_node() {
    local n=$1
    # `wait` blocks until the pid file appears and the rabbit app has booted
    if ! ctl "$n" -q wait --timeout "$WAIT_S" "$DIR/pr$n/pid" >/dev/null 2>&1; then
        echo "rabbitmq-cluster: $(node "$n") did not start; its log:" >&2
        tail -n 40 "$DIR/pr$n/log/console.log" >&2 || true
        exit 1
    fi
}

members() {
    # the cluster's members as node 1 sees them, one per line
    ctl 1 -q cluster_status --formatter json 2>/dev/null \
        | python3 -c 'import json,sys; print("\n".join(json.load(sys.stdin)["disk_nodes"]))'
}

join() {
    local n=$1
    ctl "$n" -q stop_app
    ctl "$n" -q reset
    ctl "$n" -q join_cluster "$(node 1)" 2>>"$DIR/pr$n/log/console.log"
    ctl "$n" -q start_app
    ctl "$n" -q await_startup --timeout "$WAIT_S" >/dev/null
    echo "rabbitmq-cluster: $(node "$n") joined $(node 1)"
}

cmd_start() {
    prepare
    local started=() joined=0 known
    for n in "${NODES[@]}"; do
        # a live VM is booting, running or paused by a partition: never start a second
        if ! vm_alive "$n"; then
            start_node "$n"
            started+=("$n")
        fi
    done
    for n in "${started[@]}"; do
        await_node "$n"
    done
    known=$(members)
    for n in 2 3; do
        if ! grep -qx "$(node "$n")" <<<"$known"; then
            join "$n"
            joined=1
        fi
    done
    if [ "$joined" = 1 ]; then
        known=$(members)
    fi
    for n in "${NODES[@]}"; do
        grep -qx "$(node "$n")" <<<"$known" \
            || { echo "rabbitmq-cluster: $(node "$n") is not clustered" >&2; exit 1; }
    done
    echo "rabbitmq-cluster: 3 nodes up: $(cmd_url)"
}

cmd_stop() {
    for n in "${NODES[@]}"; do
        if running "$n"; then
            ctl "$n" -q stop >/dev/null 2>&1 || true
        fi
        if vm_alive "$n"; then
            kill -KILL "$(cat "$DIR/pr$n/pid")" 2>/dev/null || true
        fi
    done
    # the nodes' data goes too: the next start is a fresh cluster
    rm -rf "$DIR"
    echo "rabbitmq-cluster: stopped"
}

cmd_status() {
    for n in "${NODES[@]}"; do
        if running "$n"; then
            ctl "$n" cluster_status
            return
        fi
    done
    echo "rabbitmq-cluster: no node is running" >&2
    exit 1
}

cmd_url() {
    echo "amqp://guest:guest@127.0.0.1:$(amqp_port 1),127.0.0.1:$(amqp_port 2),127.0.0.1:$(amqp_port 3)/"
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    url) cmd_url ;;
    pid) cat "$DIR/pr${2:?node number 1..3}/pid" ;;
    ctl) shift; n=${1:?node number 1..3}; shift; ctl "$n" "$@" ;;
    *) echo "usage: $0 start|stop|status|url|pid N|ctl N ARGS..." >&2; exit 2 ;;
esac
