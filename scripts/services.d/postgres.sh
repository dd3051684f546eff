# PostgreSQL from Debian's packages: a private cluster on 127.0.0.1:15432,
# durable defaults (fsync and synchronous_commit on), trust auth on loopback.
PG_PORT=$(port 15432)
PG_DATA=$NOLOCK_STATE/postgres
PG_LOG=$NOLOCK_STATE/postgres.log

# pg_bin prints the newest installed server's bin dir, or nothing.
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

# pg_as_owner runs a command as the cluster's owner: initdb refuses root.
pg_as_owner() {
  if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

postgres_install() {
  [[ -n $(pg_bin) && -x $(pg_bin)/initdb ]] && return 0
  log "postgres: installing the postgresql package (apt)"
  local sudo=; [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >&2
  [[ -x $(pg_bin)/initdb ]] || die "postgres: initdb not found after install"
}

postgres_up() {
  postgres_install
  local bin; bin=$(pg_bin)
  if pg_as_owner "$bin/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; then
    log "postgres: already running on 127.0.0.1:$PG_PORT"
    postgres_log_prefix
    postgres_max_connections
    pg_as_owner "$bin/pg_ctl" -D "$PG_DATA" reload >/dev/null
    return 0
  fi
  if [[ ! -s $PG_DATA/PG_VERSION ]]; then
    log "postgres: initdb $PG_DATA"
    mkdir -p "$PG_DATA"
    [[ $(id -u) == 0 ]] && chown postgres:postgres "$PG_DATA"
    chmod 700 "$PG_DATA"
    pg_as_owner "$bin/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    cat >>"$PG_DATA/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_DATA'
shared_buffers = 256MB
fsync = on
synchronous_commit = on
CONF
  fi
  postgres_log_prefix
  postgres_max_connections
  # Keep the log bounded across restarts: tests provoke server errors on
  # purpose, and each is logged with its statement.
  if [[ -f $PG_LOG ]] && (($(stat -c %s "$PG_LOG") > 64 << 20)); then
    tail -c $((1 << 20)) "$PG_LOG" >"$PG_LOG.tmp" && mv "$PG_LOG.tmp" "$PG_LOG"
  fi
  [[ $(id -u) == 0 ]] && touch "$PG_LOG" && chown postgres "$PG_LOG"
  log "postgres: starting $("$bin/postgres" --version)"
  pg_as_owner "$bin/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t 60 start >/dev/null
  wait_port "$PG_PORT" 30 postgres
}

# postgres_log_prefix makes each session's log lines name its database, so
# that a test on a database of its own can count the ERROR lines it caused
# (testenv.ErrorLines), unless the cluster's configuration sets a prefix
# of its own.
postgres_log_prefix() {
  grep -q '^log_line_prefix' "$PG_DATA/postgresql.conf" ||
    echo "log_line_prefix = '%m [%p] %qdb=%d '" >>"$PG_DATA/postgresql.conf"
}

# postgres_max_connections sets max_connections to 1000 unless the
# configuration sets at least that: the suite's packages overlap longer on
# a loaded machine, and at 300 they ran out of connections. A running
# server takes it at its next start.
postgres_max_connections() {
  local n
  n=$(sed -n 's/^[[:space:]]*max_connections[[:space:]]*=[[:space:]]*\([0-9]*\).*/\1/p' "$PG_DATA/postgresql.conf" | tail -n 1)
  if [[ -z $n || $n -lt 1000 ]]; then
    echo "max_connections = 1000" >>"$PG_DATA/postgresql.conf"
    if pg_as_owner "$(pg_bin)/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; then
      log "postgres: max_connections = 1000 takes effect at the next start (scripts/services down; scripts/services up)"
    fi
  fi
}

postgres_down() {
  local bin; bin=$(pg_bin)
  [[ -n $bin && -s $PG_DATA/PG_VERSION ]] || return 0
  if pg_as_owner "$bin/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; then
    log "postgres: stopping"
    pg_as_owner "$bin/pg_ctl" -D "$PG_DATA" -m fast -w stop >/dev/null
  fi
}

postgres_status() {
  local bin; bin=$(pg_bin)
  if [[ -n $bin ]] && pg_as_owner "$bin/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; then
    log "postgres: running $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT (data $PG_DATA)"
  else
    log "postgres: stopped"
  fi
}

postgres_env() {
  echo "export NOLOCK_TEST_POSTGRES='postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable'"
  echo "export NOLOCK_TEST_POSTGRES_LOG='$PG_LOG'"
}
