#!/usr/bin/env bash
# A local Apache Kafka KRaft cluster on loopback, for tests and for people.
#   scripts/kafka.sh up N      N combined controller+broker nodes (1 or 3 usually) on free
#                              loopback ports in a temp directory of their own; waits until
#                              every node serves, then prints KAFKA_DIR=... and
#                              KAFKA_BOOTSTRAP_SERVERS=... as its last two lines.
#   scripts/kafka.sh down DIR  kills that cluster and removes DIR (its data with it).
#   scripts/kafka.sh stop DIR I / start DIR I [I...]   stops node I (1..N), or starts nodes.
#   scripts/kafka.sh kill DIR I   kills node I with SIGKILL (a crash, not a shutdown).
#   scripts/kafka.sh acl DIR ARGS...   Kafka's ACL tool against the cluster (e.g. --add
#                              --allow-principal User:worker --operation Write --topic T).
# KAFKA_BROKER_PROPERTIES (lines) is added to every node's server.properties.
# With KAFKA_SASL=1, `up` also opens a SASL_PLAINTEXT listener (mechanism PLAIN, users admin and
# worker, passwords admin-secret and worker-secret) under Kafka's StandardAuthorizer: a client
# there gets only what its ACLs allow; the PLAINTEXT listener's ANONYMOUS is a super user (the
# tests' own clients and the nodes themselves). Its addresses: KAFKA_SASL_BOOTSTRAP_SERVERS=...
# before the last two lines.
# With KAFKA_OWNER_PID set, `up` also takes the cluster down when that process ends. As a
# nextest setup script (NEXTEST_ENV set), `up` names the cluster to the tests in
# MEDIA_TEST_KAFKA_DIR and MEDIA_TEST_KAFKA_BOOTSTRAP, and nextest (its parent) owns it.
# The broker's jars come from `scripts/setup.sh --test` (Maven, scripts/kafka/pom.xml) into
# KAFKA_LIBS (default ~/.cache/media-worker/kafka-<version>/lib).
set -euo pipefail

VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$(dirname "$0")/kafka/pom.xml")
LIBS=${KAFKA_LIBS:-$HOME/.cache/media-worker/kafka-$VERSION/lib}
# Three nodes beside the workers on 2 cores and 24 GiB: a small heap, a serial collector and
# few threads each.
JAVA_OPTS=${KAFKA_JAVA_OPTS:--Xms192m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:ActiveProcessorCount=2 -Xss512k -Djava.awt.headless=true}

# N loopback ports, distinct, random below the kernel's ephemeral range: an outgoing connection
# (the tests make thousands) must not take a node's port before it binds, nor while a test holds
# the node down for an outage. With KAFKA_PORT_CLAIMS (a directory), a port is handed out once
# there, as the tests' own `free_port` does, so clusters and servers started side by side differ.
free_ports() { # n
  python3 - "$1" "${KAFKA_PORT_CLAIMS:-}" <<'PY'
import os, random, socket, sys
n, claims = int(sys.argv[1]), sys.argv[2]
held, ports = [], []
for _ in range(10000):
    if len(ports) == n:
        break
    port = random.randrange(20000, 32000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        if claims:
            os.makedirs(claims, exist_ok=True)
            os.close(os.open(os.path.join(claims, str(port)), os.O_CREAT | os.O_EXCL))
    except OSError:
        s.close()
        continue
    held.append(s)
    ports.append(port)
if len(ports) < n:
    sys.exit("kafka.sh: no free loopback ports in 20000..32000")
print(" ".join(map(str, ports)))
PY
}

java_run() { # class, args...
  # shellcheck disable=SC2086
  java $JAVA_OPTS -Dlog4j2.configurationFile="$DIR/log4j2.properties" -cp "$LIBS/*" "$@"
}

exec_java() { # class, args... (replaces the calling subshell)
  # shellcheck disable=SC2086
  exec java $JAVA_OPTS -Dlog4j2.configurationFile="$DIR/log4j2.properties" -cp "$LIBS/*" "$@"
}

node_start() { # i
  local i=$1
  # Where this start's lines begin: an earlier start's "started" does not count.
  stat -c %s "$DIR/node$i/kafka.log" 2>/dev/null >"$DIR/node$i/offset" || echo 0 >"$DIR/node$i/offset"
  # exec: the recorded pid is the JVM's own.
  (exec_java kafka.Kafka "$DIR/node$i/server.properties") >>"$DIR/node$i/kafka.log" 2>&1 &
  echo $! >"$DIR/node$i/pid"
}

node_stop() { # i
  local pidfile=$DIR/node$1/pid
  [ -f "$pidfile" ] || return 0
  local pid
  pid=$(cat "$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

wait_serving() { # i port
  local i=$1 port=$2
  for _ in $(seq 1 600); do
    if tail -c +$(( $(cat "$DIR/node$i/offset") + 1 )) "$DIR/node$i/kafka.log" 2>/dev/null | grep -q "Kafka Server started" \
      && python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$(cat "$DIR/node$i/pid")" 2>/dev/null; then
      # The reason comes first; the tail is the shutdown it caused.
      echo "kafka.sh: node $i exited:" >&2
      grep -m 5 -E " (ERROR|FATAL) |Exception" "$DIR/node$i/kafka.log" >&2 || true
      echo "..." >&2; tail -15 "$DIR/node$i/kafka.log" >&2; return 1
    fi
    sleep 0.1
  done
  echo "kafka.sh: node $i did not start within 60 s" >&2; tail -30 "$DIR/node$i/kafka.log" >&2
  return 1
}

case "${1:-}" in
  up)
    N=${2:-1}
    [ -d "$LIBS" ] || { echo "kafka.sh: no broker in $LIBS: run make setup-test" >&2; exit 1; }
    DIR=$(mktemp -d "${TMPDIR:-/tmp}/kafka.XXXXXX")
    cat >"$DIR/log4j2.properties" <<'EOF'
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
EOF
    voters=""; brokers=""; formats=""
    declare -a BPORT CPORT SPORT
    sasl_brokers=""
    read -ra PORTS <<<"$(free_ports $(( 3 * N )))"
    for i in $(seq 1 "$N"); do
      BPORT[$i]=${PORTS[$(( 3 * i - 3 ))]}; CPORT[$i]=${PORTS[$(( 3 * i - 2 ))]}; SPORT[$i]=${PORTS[$(( 3 * i - 1 ))]}
      voters+="${voters:+,}$i@127.0.0.1:${CPORT[$i]}"
      brokers+="${brokers:+,}127.0.0.1:${BPORT[$i]}"
      sasl_brokers+="${sasl_brokers:+,}127.0.0.1:${SPORT[$i]}"
    done
    rf=$(( N >= 3 ? 3 : 1 )); isr=$(( N >= 3 ? 2 : 1 ))
    # A cluster id as `kafka-storage random-uuid` makes one (a base64url UUID), without a JVM;
    # like Kafka's Uuid.randomUuid, never one starting with "-", which the storage tool would
    # take for an option (1 cluster in 64 failed to format).
    cluster=$(python3 -c '
import base64, uuid
while (c := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
    pass
print(c)')
    for i in $(seq 1 "$N"); do
      mkdir -p "$DIR/node$i/data"
      cat >"$DIR/node$i/server.properties" <<EOF
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:${BPORT[$i]},CONTROLLER://127.0.0.1:${CPORT[$i]}
advertised.listeners=PLAINTEXT://127.0.0.1:${BPORT[$i]}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DIR/node$i/data
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
auto.create.topics.enable=true
group.initial.rebalance.delay.ms=0
# Tests use short session timeouts (3 s) to see evictions quickly, with either group protocol:
# classic (the client sets them) and consumer (KIP-848: the broker does).
group.min.session.timeout.ms=1000
group.consumer.min.session.timeout.ms=1000
group.consumer.session.timeout.ms=6000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.heartbeat.interval.ms=2000
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
background.threads=2
log.segment.bytes=16777216
log.retention.check.interval.ms=600000
${KAFKA_BROKER_PROPERTIES:-}
EOF
      if [ "${KAFKA_SASL:-}" = 1 ]; then
        # Later lines win: the listeners gain a SASL one; the authorizer applies to every
        # listener, ANONYMOUS (PLAINTEXT and CONTROLLER) being a super user.
        cat >>"$DIR/node$i/server.properties" <<EOF
listeners=PLAINTEXT://127.0.0.1:${BPORT[$i]},CONTROLLER://127.0.0.1:${CPORT[$i]},SASL_PLAINTEXT://127.0.0.1:${SPORT[$i]}
advertised.listeners=PLAINTEXT://127.0.0.1:${BPORT[$i]},SASL_PLAINTEXT://127.0.0.1:${SPORT[$i]}
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT
sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_admin="admin-secret" user_worker="worker-secret";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS;User:admin
allow.everyone.if.no.acl.found=false
EOF
      fi
      # The nodes' storage is formatted side by side: a JVM start each.
      java_run kafka.tools.StorageTool format -t "$cluster" -c "$DIR/node$i/server.properties" \
        >>"$DIR/node$i/kafka.log" 2>&1 &
      formats+=" $!"
    done
    for p in $formats; do
      wait "$p" || { echo "kafka.sh: formatting the storage failed:" >&2; tail -30 "$DIR"/node*/kafka.log >&2; "$0" down "$DIR"; exit 1; }
    done
    for i in $(seq 1 "$N"); do node_start "$i"; done
    for i in $(seq 1 "$N"); do wait_serving "$i" "${BPORT[$i]}" || { "$0" down "$DIR"; exit 1; }; done
    echo "$brokers" >"$DIR/bootstrap"
    if [ -n "${NEXTEST_ENV:-}" ]; then
      printf 'MEDIA_TEST_KAFKA_DIR=%s\nMEDIA_TEST_KAFKA_BOOTSTRAP=%s\n' "$DIR" "$brokers" >>"$NEXTEST_ENV"
      KAFKA_OWNER_PID=${KAFKA_OWNER_PID:-$PPID}
    fi
    # A cluster owned by a process (a test) goes down when that process ends, however it ends.
    if [ -n "${KAFKA_OWNER_PID:-}" ]; then
      setsid nohup bash -c 'while kill -0 "$1" 2>/dev/null && [ -d "$2" ]; do sleep 1; done; [ -d "$2" ] && "$0" down "$2"' \
        "$0" "$KAFKA_OWNER_PID" "$DIR" >/dev/null 2>&1 &
    fi
    if [ "${KAFKA_SASL:-}" = 1 ]; then echo "KAFKA_SASL_BOOTSTRAP_SERVERS=$sasl_brokers"; fi
    echo "KAFKA_DIR=$DIR"
    echo "KAFKA_BOOTSTRAP_SERVERS=$brokers"
    ;;
  acl)
    DIR=${2:?usage: kafka.sh acl DIR ARGS...}; shift 2
    # The tool's own clients log warnings only: its output is the ACLs.
    sed 's/^rootLogger.level = INFO/rootLogger.level = WARN/; s/^logger.kafka.level = INFO/logger.kafka.level = WARN/' \
      "$DIR/log4j2.properties" >"$DIR/log4j2-tool.properties"
    # shellcheck disable=SC2086
    java $JAVA_OPTS -Dlog4j2.configurationFile="$DIR/log4j2-tool.properties" -cp "$LIBS/*" \
      org.apache.kafka.tools.AclCommand --bootstrap-server "$(cut -d, -f1 "$DIR/bootstrap")" "$@"
    ;;
  down)
    # Its data goes too, so no controlled shutdown: SIGKILL every node, wait for each to go.
    DIR=${2:?usage: kafka.sh down DIR}
    for p in "$DIR"/node*/pid; do [ -f "$p" ] && kill -KILL "$(cat "$p")" 2>/dev/null; done
    for p in "$DIR"/node*/pid; do
      [ -f "$p" ] || continue
      for _ in $(seq 1 100); do kill -0 "$(cat "$p")" 2>/dev/null || break; sleep 0.1; done
    done
    rm -rf "$DIR"
    ;;
  stop)
    DIR=${2:?usage: kafka.sh stop DIR I}; node_stop "${3:?}"
    ;;
  kill)
    DIR=${2:?usage: kafka.sh kill DIR I}; pidfile=$DIR/node${3:?}/pid
    kill -KILL "$(cat "$pidfile")"; rm -f "$pidfile"
    ;;
  start)
    # Several nodes at once (a quorum cannot form one node at a time), then waits for each.
    DIR=${2:?usage: kafka.sh start DIR I [I...]}; shift 2
    for i in "${@:?usage: kafka.sh start DIR I [I...]}"; do node_start "$i"; done
    for i in "$@"; do
      port=$(sed -n 's#^listeners=PLAINTEXT://127.0.0.1:\([0-9]*\),.*#\1#p' "$DIR/node$i/server.properties")
      wait_serving "$i" "$port"
    done
    ;;
  *)
    sed -n '2,22p' "$0"; exit 2
    ;;
esac
