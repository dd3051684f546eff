# Apache Kafka in KRaft mode from Maven Central jars, run with the machine's
# Java 17: no Docker, no download site (archive.apache.org is unreachable).
#
#   single node   broker 127.0.0.1:19092, controller 127.0.0.1:19093
#                 kafka_up / kafka_down / kafka_status / kafka_env
#   three nodes   brokers 127.0.0.1:19192,19292,19392; controllers 19193,19293,19393
#                 kafka3_up / kafka3_down / kafka3_status / kafka3_env,
#                 kafka3_node_start N / kafka3_node_stop N (pid: $NOLOCK_STATE/kafka3-N.pid)
#
# Version: 4.4.0, the newest kafka_2.13 on Maven Central here. Proven with a
# throwaway probe using github.com/segmentio/kafka-go v0.4.51 against this
# script's broker: CreateTopics, Writer (Produce), ListOffsets, ConsumerGroup
# with two members (FindCoordinator v0, JoinGroup v2, SyncGroup v0,
# Heartbeat v0, LeaveGroup v0), gen.Start + group-less Reader (Fetch),
# CommitOffsets (OffsetCommit v2), a new member getting the committed offsets
# (OffsetFetch v1), Reader{GroupID}, Client.OffsetFetch, Client.DeleteGroups,
# DeleteTopics: all passed on 4.4.0 and on 4.0.0, single node and three nodes.
# No step-down was needed. The known break (kafka-go issue #1378: broker log
# "UnsupportedVersionException: Received request for api with key 11
# (JoinGroup) and unsupported version 1") hits kafka-go <= v0.4.47, which sent
# JoinGroup v1; 4.0.0 accepts JoinGroup v2-v9 only (KIP-896), 4.0.1+/4.1+
# accept v0-v9 again (KAFKA-19444), and v0.4.51 negotiates v1-v2 anyway.
# Lowest versions 4.4.0 still accepts, against what kafka-go's ConsumerGroup
# sends: OffsetCommit v2 (min 2), OffsetFetch v1 (min 1), Fetch min v4
# (kafka-go negotiates up to v10), ListOffsets v1 (min 1): no slack left on
# OffsetCommit/OffsetFetch/ListOffsets, so rerun the probe before a bump.
# NOLOCK_KAFKA_VERSION overrides it to try another 4.x (own jar cache; the
# single-node data dir is wiped when the version changes).
KAFKA_VERSION=${NOLOCK_KAFKA_VERSION:-4.4.0}
KAFKA_DEP_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.8.1
# log4j for Kafka versions whose pom names none (4.0.x); 4.0's tarball ships 2.24.3.
KAFKA_LOG4J_FALLBACK=2.24.3

KAFKA_HOME=$NOLOCK_CACHE/kafka-$KAFKA_VERSION
KAFKA_PORT=$(port 19092)
KAFKA_CONTROLLER_PORT=$(port 19093)
KAFKA_DIR=$NOLOCK_STATE/kafka
KAFKA_PID=$NOLOCK_STATE/kafka.pid
KAFKA_HEAP=${KAFKA_HEAP:--Xms256m -Xmx512m}
KAFKA3_HEAP=${KAFKA3_HEAP:--Xms192m -Xmx384m}
KAFKA_JAVA=${KAFKA_JAVA:-java}

# kafka_tools installs Java and Maven from Debian when a fresh machine lacks them.
kafka_tools() {
  command -v "$KAFKA_JAVA" >/dev/null && command -v mvn >/dev/null && return 0
  log "kafka: installing java and maven (apt)"
  local sudo=; [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openjdk-17-jre-headless maven >&2
}

# kafka_log4j_jars DIR adds what the broker needs to log through log4j2.
# kafka_2.13's pom has no SLF4J binding (the release tarball adds one), and
# without one SLF4J silently drops every log line; 4.0.x's pom does not even
# bring log4j-core. So: log4j-api, log4j-core and the SLF4J 1.x bridge
# log4j-slf4j-impl, at the log4j-core version Kafka's pom chose if any.
kafka_log4j_jars() {
  local dir=$1 core v
  core=$(find "$dir" -name 'log4j-core-*.jar' | head -n 1)
  v=${core##*/log4j-core-}; v=${v%.jar}
  [[ -n $v ]] || v=$KAFKA_LOG4J_FALLBACK
  kafka_mvn_copy log4j "$dir" -DexcludeGroupIds=org.slf4j -- \
    "org.apache.logging.log4j:log4j-api:$v" "org.apache.logging.log4j:log4j-core:$v" \
    "org.apache.logging.log4j:log4j-slf4j-impl:$v"
}

# kafka_mvn_copy NAME DIR [mvn flags...] -- GROUP:ARTIFACT:VERSION...
# resolves the artifacts' runtime closure with Maven into DIR, through a
# generated pom $KAFKA_HOME/pom-NAME.xml; Maven's output goes to mvn.log.
kafka_mvn_copy() {
  local name=$1 dir=$2 flags=() deps="" gav g a v
  shift 2
  while [[ $# -gt 0 && $1 != -- ]]; do flags+=("$1"); shift; done
  shift
  for gav in "$@"; do
    IFS=: read -r g a v <<<"$gav"
    deps+="    <dependency><groupId>$g</groupId><artifactId>$a</artifactId><version>$v</version></dependency>"$'\n'
  done
  cat >"$KAFKA_HOME/pom-$name.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>nolock.services</groupId>
  <artifactId>kafka-$name</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
$deps  </dependencies>
</project>
POM
  mvn -q -B -f "$KAFKA_HOME/pom-$name.xml" -Dmaven.repo.local="$NOLOCK_CACHE/m2" \
    "$KAFKA_DEP_PLUGIN:copy-dependencies" -DincludeScope=runtime \
    "${flags[@]}" -DoutputDirectory="$dir" >>"$KAFKA_HOME/mvn.log" 2>&1 \
    || { tail -n 40 "$KAFKA_HOME/mvn.log" >&2; die "kafka: mvn could not resolve $*"; }
}

# kafka_jars resolves the broker's runtime classpath into $KAFKA_HOME/libs once.
# It copies into a temp dir and renames, so an interrupted run never leaves a
# half-filled libs dir that later runs would trust.
kafka_jars() {
  [[ -f $KAFKA_HOME/libs/.complete ]] && return 0
  kafka_tools
  local t0 tmp=$KAFKA_HOME/libs.tmp
  t0=$(kafka_now)
  log "kafka: resolving jars for $KAFKA_VERSION from Maven Central"
  mkdir -p "$KAFKA_HOME"
  rm -rf "$tmp"
  : >"$KAFKA_HOME/mvn.log"
  kafka_mvn_copy libs "$tmp" -- "org.apache.kafka:kafka_2.13:$KAFKA_VERSION"
  [[ -f $tmp/kafka_2.13-$KAFKA_VERSION.jar ]] || die "kafka: kafka_2.13-$KAFKA_VERSION.jar missing after mvn"
  kafka_log4j_jars "$tmp"
  touch "$tmp/.complete"
  rm -rf "$KAFKA_HOME/libs"
  mv "$tmp" "$KAFKA_HOME/libs"
  log "kafka: resolved $(find "$KAFKA_HOME/libs" -name '*.jar' | wc -l) jars in $(kafka_since "$t0") ($(du -sh "$KAFKA_HOME/libs" | cut -f1))"
}

# kafka_now prints a microsecond clock; kafka_since T0 prints seconds since it.
kafka_now() { echo "${EPOCHREALTIME/./}"; }
kafka_since() {
  local us=$(($(kafka_now) - $1))
  printf '%d.%ds' $((us / 1000000)) $((us % 1000000 / 100000))
}

# kafka_java runs a Kafka main class on the cached classpath in the foreground.
kafka_java() {
  "$KAFKA_JAVA" -Xmx256m -cp "$KAFKA_HOME/libs/*" \
    -Dlog4j2.configurationFile="$NOLOCK_STATE/kafka-tools-log4j2.properties" "$@"
}

# kafka_log4j DIR LEVEL writes a log4j2 config that sends everything to
# DIR/server.log (never stdout), root at LEVEL, broker lifecycle at INFO so the
# file still says which version started and when.
kafka_log4j() {
  local dir=$1 level=$2
  cat >"$dir/log4j2.properties" <<PROPS
status = warn
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = $dir/server.log
appender.file.filePattern = $dir/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = $level
rootLogger.appenderRef.file.ref = file
logger.raft.name = kafka.server.KafkaRaftServer
logger.raft.level = INFO
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = INFO
logger.controller.name = kafka.server.ControllerServer
logger.controller.level = INFO
logger.appinfo.name = org.apache.kafka.common.utils.AppInfoParser
logger.appinfo.level = INFO
PROPS
}

# kafka_tools_log4j keeps one-shot tools (storage format) quiet on stdout.
# Written before formats start, never during: kafka3 formats in parallel.
kafka_tools_log4j() {
  cat >"$NOLOCK_STATE/kafka-tools-log4j2.properties" <<PROPS
status = error
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %p %m%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = err
PROPS
}

# kafka_common_props prints the settings both layouts share: loopback only,
# topics created on first use, no rebalance delay so group tests are fast.
kafka_common_props() {
  cat <<PROPS
process.roles=broker,controller
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
auto.create.topics.enable=true
delete.topic.enable=true
num.partitions=1
group.initial.rebalance.delay.ms=0
# Fewer internal partitions: the first group or transaction in a fresh data
# dir then waits for 10 partition leaders instead of 50.
offsets.topic.num.partitions=10
transaction.state.log.num.partitions=10
PROPS
}

# kafka_cluster_id prints a fresh KRaft cluster id: 16 random bytes in
# base64url without padding (Uuid.toString's format), never starting with "-"
# because the storage tool would read that as an option.
kafka_cluster_id() {
  local id
  while :; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
    [[ $id != -* ]] && { echo "$id"; return 0; }
  done
}

# kafka_format DIR CLUSTER_ID [FLAGS...] formats DIR/data unless it already is.
kafka_format() {
  local dir=$1 id=$2; shift 2
  [[ -s $dir/data/meta.properties ]] && return 0
  log "kafka: formatting $dir/data (cluster $id${*:+, $*})"
  kafka_java kafka.tools.StorageTool format -t "$id" -c "$dir/server.properties" \
    --ignore-formatted "$@" >"$dir/format.log" 2>&1 \
    || { cat "$dir/format.log" >&2; die "kafka: storage format failed in $dir"; }
}

# kafka_spawn DIR PIDFILE HEAP starts the broker in DIR in its own session
# (setsid), so it outlives the shell and the caller's process group; its
# stdout and stderr (JVM crashes, log4j status lines) go to DIR/stdout.log.
kafka_spawn() {
  local dir=$1 pidfile=$2 heap=$3
  # shellcheck disable=SC2086 # $heap holds several JVM flags
  setsid nohup "$KAFKA_JAVA" $heap -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$dir/log4j2.properties" \
    -cp "$KAFKA_HOME/libs/*" kafka.Kafka "$dir/server.properties" \
    >"$dir/stdout.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  echo "$KAFKA_VERSION" >"$dir/version"
}

# kafka_metadata PORT prints how many brokers a Metadata v1 request to
# 127.0.0.1:PORT lists (nothing if the broker does not answer in 3 s).
# A KRaft broker binds its port before it has caught up with the metadata
# log and been unfenced; only then does it answer requests, so an answer
# that lists brokers means producers and consumers will work.
# Request: size 14, api_key 3, version 1, correlation 7, null client id,
# null topic array (= all topics). Response starts: size, correlation, brokers.
kafka_metadata() {
  local port=$1
  # shellcheck disable=SC2016 # $1 expands in the inner bash
  timeout 3 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf "\x00\x00\x00\x0e\x00\x03\x00\x01\x00\x00\x00\x07\xff\xff\xff\xff\xff\xff" >&3
    head -c 12 <&3 | od -An -tu1 -v
  ' _ "$port" 2>/dev/null | awk 'NF { for (i = 1; i <= NF; i++) b[n++] = $i }
    END { if (n == 12 && b[4] == 0 && b[5] == 0 && b[6] == 0 && b[7] == 7)
            print b[8] * 16777216 + b[9] * 65536 + b[10] * 256 + b[11] }'
}

# kafka_coordinator PORT prints the error code of a FindCoordinator v0 request
# for a warm-up group (0 = a coordinator is up). The first such request in a
# fresh data dir creates __consumer_offsets; until its partitions have leaders
# the broker answers 15 (COORDINATOR_NOT_AVAILABLE), and kafka-go's
# ConsumerGroup.Next returns that error to the caller instead of retrying, so
# tests would flake on a freshly formatted broker without this warm-up.
# Request: size 25, api_key 10, version 0, correlation 8, null client id,
# group "nolock-warmup". Response starts: size, correlation, error code.
kafka_coordinator() {
  local port=$1
  # shellcheck disable=SC2016 # $1 expands in the inner bash
  timeout 3 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf "\x00\x00\x00\x19\x00\x0a\x00\x00\x00\x00\x00\x08\xff\xff\x00\x0dnolock-warmup" >&3
    head -c 10 <&3 | od -An -tu1 -v
  ' _ "$port" 2>/dev/null | awk 'NF { for (i = 1; i <= NF; i++) b[n++] = $i }
    END { if (n == 10 && b[7] == 8) print b[8] * 256 + b[9] }'
}

# kafka_wait_coordinator PORT SECS waits until group coordination works.
kafka_wait_coordinator() {
  local port=$1 secs=$2 code deadline=$((SECONDS + $2))
  while ((SECONDS < deadline)); do
    code=$(kafka_coordinator "$port") || true
    [[ $code == 0 ]] && return 0
    sleep 0.2
  done
  die "kafka: no group coordinator on 127.0.0.1:$port within ${secs}s (last error code '${code:-none}')"
}

# kafka_wait_ready PORT PIDFILE DIR BROKERS SECS waits until the broker on PORT
# lists at least BROKERS brokers; fails early, with its log, if it died.
kafka_wait_ready() {
  local port=$1 pidfile=$2 dir=$3 want=$4 secs=$5 n deadline=$((SECONDS + $5))
  while ((SECONDS < deadline)); do
    if ! kafka_alive "$pidfile"; then
      tail -n 30 "$dir/stdout.log" "$dir/server.log" >&2 2>/dev/null || true
      die "kafka: broker on 127.0.0.1:$port exited during startup (logs in $dir)"
    fi
    n=$(kafka_metadata "$port") || true
    [[ -n $n ]] && ((n >= want)) && return 0
    sleep 0.2
  done
  die "kafka: broker on 127.0.0.1:$port not ready within ${secs}s (logs in $dir)"
}

# kafka_alive PIDFILE: like pid_alive, but a zombie does not count.
kafka_alive() {
  pid_alive "$1" || return 1
  local state
  state=$(awk '{ print $3 }' "/proc/$(cat "$1")/stat" 2>/dev/null) || return 1
  [[ $state != Z ]]
}

# kafka_settle PIDFILE PORT: a test that just SIGKILLed a broker may ask to
# start it again while the JVM is still exiting; give a pid whose port is
# closed up to 3 s to either die or open its port (a broker still starting).
kafka_settle() {
  local i
  for ((i = 0; i < 30; i++)); do
    kafka_alive "$1" || return 0
    (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null && return 0
    sleep 0.1
  done
}

# kafka_running PIDFILE PORT: the process lives and its port answers.
kafka_running() {
  kafka_alive "$1" && (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null
}

# kafka_running_version DIR prints the version a broker in DIR was started with.
kafka_running_version() { cat "$1/version" 2>/dev/null || echo unknown; }

# ---- single node ----------------------------------------------------------

kafka_write_props() {
  mkdir -p "$KAFKA_DIR/data"
  {
    kafka_common_props
    cat <<PROPS
node.id=1
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
# Dynamic quorum (KIP-853): a one-voter controller formatted with --standalone.
controller.quorum.bootstrap.servers=127.0.0.1:$KAFKA_CONTROLLER_PORT
log.dirs=$KAFKA_DIR/data
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
PROPS
  } >"$KAFKA_DIR/server.properties"
  kafka_log4j "$KAFKA_DIR" "${KAFKA_LOG_LEVEL:-WARN}"
}

kafka_up() {
  # A live pid may be a broker still starting: wait for it rather than start
  # a second one on the same data dir.
  kafka_settle "$KAFKA_PID" "$KAFKA_PORT"
  if kafka_alive "$KAFKA_PID"; then
    local running; running=$(kafka_running_version "$KAFKA_DIR")
    if [[ $running == "$KAFKA_VERSION" ]]; then
      kafka_wait_ready "$KAFKA_PORT" "$KAFKA_PID" "$KAFKA_DIR" 1 60
      log "kafka: already running $running on 127.0.0.1:$KAFKA_PORT (pid $(cat "$KAFKA_PID"))"
      return 0
    fi
    log "kafka: running $running but $KAFKA_VERSION is pinned: restarting"
    kafka_down
  fi
  # Data from another version is test data only; a fresh dir avoids downgrade
  # and metadata.version surprises.
  if [[ -d $KAFKA_DIR/data && $(kafka_running_version "$KAFKA_DIR") != "$KAFKA_VERSION" ]]; then
    log "kafka: wiping $KAFKA_DIR/data (written by $(kafka_running_version "$KAFKA_DIR"))"
    rm -rf "$KAFKA_DIR/data"
  fi
  kafka_jars
  kafka_write_props
  kafka_tools_log4j
  kafka_format "$KAFKA_DIR" "$(kafka_cluster_id)" --standalone
  local t0; t0=$(kafka_now)
  log "kafka: starting $KAFKA_VERSION on 127.0.0.1:$KAFKA_PORT (logs $KAFKA_DIR/server.log)"
  kafka_spawn "$KAFKA_DIR" "$KAFKA_PID" "$KAFKA_HEAP"
  # Not wait_port: this loop also notices a broker that died (port taken,
  # bad config) at once instead of after the timeout.
  kafka_wait_ready "$KAFKA_PORT" "$KAFKA_PID" "$KAFKA_DIR" 1 60
  kafka_wait_coordinator "$KAFKA_PORT" 60
  log "kafka: ready in $(kafka_since "$t0") (pid $(cat "$KAFKA_PID"))"
}

kafka_down() { stop_pid "$KAFKA_PID" kafka; }

kafka_status() {
  if kafka_running "$KAFKA_PID" "$KAFKA_PORT"; then
    log "kafka: running $(kafka_running_version "$KAFKA_DIR") on 127.0.0.1:$KAFKA_PORT (pid $(cat "$KAFKA_PID"))"
  else
    log "kafka: stopped"
  fi
}

kafka_env() { echo "export NOLOCK_TEST_KAFKA=127.0.0.1:$KAFKA_PORT"; }

# ---- three nodes, for tests that kill a broker ----------------------------
# Node N (1..3): broker port 19N92, controller 19N93, dir $NOLOCK_STATE/kafka3-N.
# A static three-voter quorum: any two nodes keep the cluster writable, and
# with min.insync.replicas=2 an acks=all write survives losing one broker.

kafka3_port() { port "19${1}92"; }
kafka3_controller_port() { port "19${1}93"; }
kafka3_dir() { echo "$NOLOCK_STATE/kafka3-$1"; }
kafka3_pid() { echo "$NOLOCK_STATE/kafka3-$1.pid"; }

kafka3_check_node() {
  [[ ${1:-} =~ ^[123]$ ]] || die "kafka3: node must be 1, 2 or 3 (got '${1:-}')"
}

kafka3_write_props() {
  local n=$1 dir; dir=$(kafka3_dir "$n")
  mkdir -p "$dir/data"
  {
    kafka_common_props
    cat <<PROPS
node.id=$n
listeners=PLAINTEXT://127.0.0.1:$(kafka3_port "$n"),CONTROLLER://127.0.0.1:$(kafka3_controller_port "$n")
advertised.listeners=PLAINTEXT://127.0.0.1:$(kafka3_port "$n")
controller.quorum.voters=1@127.0.0.1:$(kafka3_controller_port 1),2@127.0.0.1:$(kafka3_controller_port 2),3@127.0.0.1:$(kafka3_controller_port 3)
log.dirs=$dir/data
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
# A SIGKILLed broker is fenced (and its partitions get new leaders) once it
# misses heartbeats for broker.session.timeout.ms: 3 s, not the default 9 s,
# so failover tests do not sit idle.
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
PROPS
  } >"$dir/server.properties"
  kafka_log4j "$dir" "${KAFKA_LOG_LEVEL:-WARN}"
}

# kafka3_stale: some node's data was written by another Kafka version.
kafka3_stale() {
  local n
  for n in 1 2 3; do
    [[ -d $(kafka3_dir "$n")/data && $(kafka_running_version "$(kafka3_dir "$n")") != "$KAFKA_VERSION" ]] && return 0
  done
  return 1
}

# kafka3_prepare writes the config of every node and formats them with one
# shared cluster id (a new one only if no node is formatted yet). Data from
# another version is wiped on all three nodes at once: they must share an id.
kafka3_prepare() {
  local n id idfile=$NOLOCK_STATE/kafka3.cluster-id
  kafka_jars
  if kafka3_stale; then
    kafka3_down
    log "kafka3: wiping data written by another Kafka version"
    for n in 1 2 3; do rm -rf "$(kafka3_dir "$n")/data"; done
    rm -f "$idfile"
  fi
  [[ -s $idfile ]] || kafka_cluster_id >"$idfile"
  id=$(cat "$idfile")
  for n in 1 2 3; do kafka3_write_props "$n"; done
  kafka_tools_log4j
  # Format in parallel: each format is a JVM start, about 1.5 s.
  local pids=()
  for n in 1 2 3; do
    kafka_format "$(kafka3_dir "$n")" "$id" &
    pids+=($!)
  done
  for n in "${pids[@]}"; do wait "$n" || die "kafka3: storage format failed"; done
}

# kafka3_spawn N starts node N unless it runs; prints nothing, waits for nothing.
kafka3_spawn() {
  local n=$1
  kafka_settle "$(kafka3_pid "$n")" "$(kafka3_port "$n")"
  if kafka_alive "$(kafka3_pid "$n")"; then
    log "kafka3: node $n already running (pid $(cat "$(kafka3_pid "$n")"))"
    return 0
  fi
  log "kafka3: starting node $n ($KAFKA_VERSION) on 127.0.0.1:$(kafka3_port "$n")"
  kafka_spawn "$(kafka3_dir "$n")" "$(kafka3_pid "$n")" "$KAFKA3_HEAP"
}

kafka3_up() {
  local n t0; t0=$(kafka_now)
  kafka3_prepare
  # Start all three before waiting: no node is ready until a quorum is up.
  for n in 1 2 3; do kafka3_spawn "$n"; done
  for n in 1 2 3; do
    kafka_wait_ready "$(kafka3_port "$n")" "$(kafka3_pid "$n")" "$(kafka3_dir "$n")" 3 120
  done
  kafka_wait_coordinator "$(kafka3_port 1)" 120
  log "kafka3: three brokers ready in $(kafka_since "$t0")"
}

# kafka3_node_start N (re)starts one node, e.g. after a test SIGKILLed it, and
# waits until it serves metadata again (the other two must be up for that).
kafka3_node_start() {
  local n=${1:-} t0; t0=$(kafka_now)
  kafka3_check_node "$n"
  kafka3_prepare
  kafka3_spawn "$n"
  kafka_wait_ready "$(kafka3_port "$n")" "$(kafka3_pid "$n")" "$(kafka3_dir "$n")" 1 120
  log "kafka3: node $n ready in $(kafka_since "$t0") (pid $(cat "$(kafka3_pid "$n")"))"
}

kafka3_node_stop() {
  kafka3_check_node "${1:-}"
  stop_pid "$(kafka3_pid "$1")" "kafka3 node $1"
}

# kafka3_down signals all nodes at once: stopped one by one, the last two
# would lose their quorum and hang in controlled shutdown until killed.
kafka3_down() {
  local n pids=()
  for n in 1 2 3; do
    kafka_alive "$(kafka3_pid "$n")" && pids+=("$(cat "$(kafka3_pid "$n")")")
  done
  if ((${#pids[@]})); then
    log "kafka3: stopping pids ${pids[*]}"
    kill "${pids[@]}" 2>/dev/null || true
  fi
  for n in 1 2 3; do stop_pid "$(kafka3_pid "$n")" "kafka3 node $n"; done
}

kafka3_status() {
  local n
  for n in 1 2 3; do
    if kafka_running "$(kafka3_pid "$n")" "$(kafka3_port "$n")"; then
      log "kafka3: node $n running $(kafka_running_version "$(kafka3_dir "$n")") on 127.0.0.1:$(kafka3_port "$n") (pid $(cat "$(kafka3_pid "$n")"))"
    else
      log "kafka3: node $n stopped"
    fi
  done
}

kafka3_env() {
  echo "export NOLOCK_TEST_KAFKA3=127.0.0.1:$(kafka3_port 1),127.0.0.1:$(kafka3_port 2),127.0.0.1:$(kafka3_port 3)"
}
