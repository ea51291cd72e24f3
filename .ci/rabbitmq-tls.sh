#!/usr/bin/env bash
# Give the local RabbitMQ an amqps:// listener on 127.0.0.1:5671 with a self-signed CA,
# for tests/security/test_tls.py. Idempotent; safe to run while tests use 5672.
#
#   .ci/rabbitmq-tls.sh            # certs + config lines + live listener (no restart)
#   .ci/rabbitmq-tls.sh --restart  # same, then restart RabbitMQ to prove the config loads
#
# 1. Certificates (made once) in $PODRACER_TLS_DIR (default /etc/rabbitmq/podracer-tls):
#    ca.pem / ca.key (test CA), server.pem / server.key (CN localhost, SAN localhost and
#    127.0.0.1, signed by the CA). Tests read ca.pem from there.
# 2. rabbitmq.conf gets an ssl listener and ssl_options (between marker lines, written
#    once), so every later start of the broker listens on 5671 too.
# 3. If the broker is already running without a 5671 listener, one is started in place
#    through rabbitmqctl eval: no restart, so connections on 5672 are untouched.
set -euo pipefail

TLS_DIR=${PODRACER_TLS_DIR:-/etc/rabbitmq/podracer-tls}
CONF=${RABBITMQ_CONFIG_FILE:-/etc/rabbitmq/rabbitmq.conf}
PORT=5671
MARK="# podracer-tls (written by .ci/rabbitmq-tls.sh)"

make_certs() {
    mkdir -p "$TLS_DIR"
    if [ -s "$TLS_DIR/ca.pem" ] && [ -s "$TLS_DIR/server.pem" ] && [ -s "$TLS_DIR/server.key" ]
    then
        return
    fi
    local tmp
    tmp=$(mktemp -d)
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
        -subj "/CN=podracer-test-ca" -keyout "$tmp/ca.key" -out "$tmp/ca.pem" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=localhost" \
        -keyout "$tmp/server.key" -out "$tmp/server.csr" 2>/dev/null
    printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=digitalSignature,keyEncipherment" \
        "extendedKeyUsage=serverAuth" "subjectAltName=DNS:localhost,IP:127.0.0.1" \
        > "$tmp/server.ext"
    openssl x509 -req -in "$tmp/server.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" \
        -CAcreateserial -days 3650 -sha256 -extfile "$tmp/server.ext" \
        -out "$tmp/server.pem" 2>/dev/null
    install -m 0644 "$tmp/ca.pem" "$tmp/server.pem" "$TLS_DIR/"
    # the broker runs as user rabbitmq and must read its key; nobody else needs to
    install -m 0640 "$tmp/ca.key" "$tmp/server.key" "$TLS_DIR/"
    if id rabbitmq >/dev/null 2>&1; then
        chgrp rabbitmq "$TLS_DIR/server.key" "$TLS_DIR/ca.key"
    fi
    rm -rf "$tmp"
    echo "rabbitmq-tls: certificates written to $TLS_DIR"
}

write_config() {
    touch "$CONF"
    if grep -qF "$MARK" "$CONF"; then
        return
    fi
    cat >> "$CONF" <<EOF
$MARK
listeners.ssl.local = 127.0.0.1:$PORT
ssl_options.cacertfile = $TLS_DIR/ca.pem
ssl_options.certfile = $TLS_DIR/server.pem
ssl_options.keyfile = $TLS_DIR/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
# end podracer-tls
EOF
    echo "rabbitmq-tls: TLS listener added to $CONF"
}

listening() {
    rabbitmqctl -q eval 'rabbit_networking:active_listeners().' 2>/dev/null \
        | grep -q "amqp/ssl"
}

start_live_listener() {
    # The same settings as the config lines above, applied to the running node; the app
    # env makes a later stop_app/start_app (no VM restart) bring the listener back too.
    rabbitmqctl -q eval "
        Opts = [{cacertfile, \"$TLS_DIR/ca.pem\"}, {certfile, \"$TLS_DIR/server.pem\"},
                {keyfile, \"$TLS_DIR/server.key\"}, {verify, verify_none},
                {fail_if_no_peer_cert, false}],
        ok = application:set_env(rabbit, ssl_options, Opts),
        ok = application:set_env(rabbit, ssl_listeners, [{\"127.0.0.1\", $PORT}]),
        rabbit_networking:start_ssl_listener({\"127.0.0.1\", $PORT}, Opts, 1)." >/dev/null
    echo "rabbitmq-tls: live TLS listener started on 127.0.0.1:$PORT"
}

make_certs
write_config
if [ "${1:-}" = "--restart" ]; then
    # the config file is read only when the node boots: a full stop and start
    rabbitmqctl -q stop >/dev/null 2>&1 || true
    rabbitmq-server -detached
    timeout 180 rabbitmqctl -q await_startup
elif timeout 20 rabbitmqctl -q status >/dev/null 2>&1 && ! listening; then
    start_live_listener
fi
if timeout 20 rabbitmqctl -q status >/dev/null 2>&1; then
    listening || { echo "rabbitmq-tls: no TLS listener after setup" >&2; exit 1; }
fi
