# Redis from Debian's packages: a private instance on 127.0.0.1:16379 for
# `nolock bench`'s lock baseline (the seed's "efficiency lock"). Not
# durable on purpose: no RDB snapshots, no AOF; the data is scratch.
REDIS_PORT=$(port 16379)
REDIS_DIR=$NOLOCK_STATE/redis
REDIS_PID=$NOLOCK_STATE/redis.pid
REDIS_LOG=$NOLOCK_STATE/redis.log

# redis_version prints the installed server's version (7.0.15).
redis_version() { redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'; }

redis_install() {
  command -v redis-server >/dev/null && return 0
  log "redis: installing the redis-server package (apt)"
  local sudo=; [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends redis-server >&2
  command -v redis-server >/dev/null || die "redis: redis-server not found after install"
}

redis_up() {
  redis_install
  if pid_alive "$REDIS_PID"; then
    log "redis: already running on 127.0.0.1:$REDIS_PORT"
    return 0
  fi
  mkdir -p "$REDIS_DIR"
  log "redis: starting $(redis_version)"
  # Debian's package also starts a system instance on 6379; this one is
  # separate: its own port, dir, pid file and log.
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --protected-mode yes \
    --dir "$REDIS_DIR" --pidfile "$REDIS_PID" --logfile "$REDIS_LOG" \
    --daemonize yes --save '' --appendonly no >/dev/null
  wait_port "$REDIS_PORT" 30 redis
}

redis_down() {
  stop_pid "$REDIS_PID" redis
}

redis_status() {
  if pid_alive "$REDIS_PID"; then
    log "redis: running $(redis_version) on 127.0.0.1:$REDIS_PORT (dir $REDIS_DIR)"
  else
    log "redis: stopped"
  fi
}

redis_env() {
  echo "export NOLOCK_TEST_REDIS=127.0.0.1:$REDIS_PORT"
}
