# etcd from Debian's packages (etcd-server, 3.4 on bookworm): a private
# one-member cluster on 127.0.0.1:12379 (its peer port 12380, loopback
# only), with its own data dir, fsync on as shipped. examples/etcdfence
# takes etcd's own lock on it. The package's system service is not used
# (it is not started in a container without an init, and would sit on
# 2379 with /var/lib/etcd).
ETCD_PORT=$(port 12379)
ETCD_PEER_PORT=$(port 12380)
ETCD_DIR=$NOLOCK_STATE/etcd
ETCD_PID=$NOLOCK_STATE/etcd.pid
ETCD_LOG=$NOLOCK_STATE/etcd.log

# etcd_version prints the installed server's version (3.4.23).
etcd_version() { etcd --version | awk '/^etcd Version:/ {print $3}'; }

etcd_install() {
  command -v etcd >/dev/null && return 0
  log "etcd: installing the etcd-server package (apt)"
  local sudo=; [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends etcd-server >&2
  command -v etcd >/dev/null || die "etcd: etcd not found after install"
}

# etcd_ours: the pid file names a running etcd serving our data dir (a
# stale pid file outlives a reboot; its pid may now be someone else's).
etcd_ours() {
  pid_alive "$ETCD_PID" || return 1
  tr '\0' ' ' <"/proc/$(cat "$ETCD_PID")/cmdline" 2>/dev/null | grep -qF -- "--data-dir $ETCD_DIR"
}

# etcd_healthy: GET /health answers {"health":"true"}: the member has a
# leader and serves a linearizable read, not merely an open port.
etcd_healthy() {
  local reply
  reply=$(timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$ETCD_PORT &&
    printf 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 && cat <&3" 2>/dev/null) || return 1
  [[ $reply == *'"health":"true"'* ]]
}

# etcd_wait SECS: wait until etcd is healthy; give up at once (showing the
# log) if it died.
etcd_wait() {
  local i
  for ((i = 0; i < $1 * 10; i++)); do
    etcd_healthy && return 0
    if ! pid_alive "$ETCD_PID"; then
      tail -n 20 "$ETCD_LOG" >&2 || true
      rm -f "$ETCD_PID"
      die "etcd exited during start (log: $ETCD_LOG)"
    fi
    sleep 0.1
  done
  tail -n 20 "$ETCD_LOG" >&2 || true
  die "etcd not healthy on 127.0.0.1:$ETCD_PORT within $1s (log: $ETCD_LOG)"
}

etcd_up() {
  etcd_install
  if etcd_ours; then
    log "etcd: already running on 127.0.0.1:$ETCD_PORT"
    etcd_wait 30
    return 0
  fi
  rm -f "$ETCD_PID"
  # A stranger on our port would answer the tests in our place.
  if (exec 3<>"/dev/tcp/127.0.0.1/$ETCD_PORT") 2>/dev/null; then
    die "127.0.0.1:$ETCD_PORT is taken by a process not started by scripts/services"
  fi
  mkdir -p "$ETCD_DIR"
  chmod 700 "$ETCD_DIR"
  # Keep the log bounded across restarts.
  if [[ -f $ETCD_LOG ]] && (($(stat -c %s "$ETCD_LOG") > 64 << 20)); then
    tail -c $((1 << 20)) "$ETCD_LOG" >"$ETCD_LOG.tmp" && mv "$ETCD_LOG.tmp" "$ETCD_LOG"
  fi
  log "etcd: starting $(etcd_version)"
  echo "--- scripts/services: starting etcd at $(date -u +%FT%TZ)" >>"$ETCD_LOG"
  # env -i: no ETCD_* variable of the caller's reaches the server (etcd
  # reads its flags from the environment too). The initial-cluster flags
  # are read only when the data dir is new. Compaction keeps an hour of
  # history, so the scratch keyspace does not grow without bound.
  # setsid: its own session, so a Ctrl-C in the calling shell does not
  # reach it; it execs, so $! is the server's own pid.
  setsid env -i PATH="$PATH" etcd --name nolock --data-dir "$ETCD_DIR" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "nolock=http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster-state new --initial-cluster-token nolock-test \
    --auto-compaction-mode periodic --auto-compaction-retention 1h \
    >>"$ETCD_LOG" 2>&1 </dev/null &
  echo $! >"$ETCD_PID"
  etcd_wait 60
  log "etcd: up on 127.0.0.1:$ETCD_PORT (pid $(cat "$ETCD_PID"))"
}

etcd_down() {
  if etcd_ours; then stop_pid "$ETCD_PID" etcd; else rm -f "$ETCD_PID"; fi
}

etcd_status() {
  if etcd_ours; then
    log "etcd: running $(etcd_version) on 127.0.0.1:$ETCD_PORT (pid $(cat "$ETCD_PID"), data $ETCD_DIR)"
  else
    log "etcd: stopped"
  fi
}

etcd_env() {
  echo "export NOLOCK_TEST_ETCD=http://127.0.0.1:$ETCD_PORT"
}
