# PgBouncer from Debian's packages: a pooler on 127.0.0.1:16432 in front of
# the shared PostgreSQL (127.0.0.1:15432), in transaction pooling, trust
# auth on loopback. Every database name is passed through (a wildcard
# entry), and each (database, user) pair gets its own pool of server
# connections, opened as that user.
PGB_PORT=$(port 16432)
PGB_DIR=$NOLOCK_STATE/pgbouncer
PGB_CONF=$PGB_DIR/pgbouncer.ini
PGB_PID=$PGB_DIR/pgbouncer.pid
PGB_LOG=$NOLOCK_STATE/pgbouncer.log
# shellcheck disable=SC2153 # PG_PORT is postgres.sh's, sourced before this file
PGB_SERVER_PORT=$PG_PORT

# pgbouncer_bin prints the pgbouncer program's path, or nothing: Debian
# installs it in /usr/sbin, which a non-root PATH may lack.
pgbouncer_bin() {
  command -v pgbouncer 2>/dev/null && return 0
  [[ -x /usr/sbin/pgbouncer ]] && echo /usr/sbin/pgbouncer
  return 0
}

# pgb_as_owner runs a command as the postgres user when run as root:
# pgbouncer refuses to run as root.
pgb_as_owner() {
  if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pgbouncer_install() {
  [[ -n $(pgbouncer_bin) ]] && return 0
  log "pgbouncer: installing the pgbouncer package (apt)"
  local sudo=; [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends pgbouncer >&2
  [[ -n $(pgbouncer_bin) ]] || die "pgbouncer: pgbouncer not found after install"
}

# pgbouncer_version prints the installed version (1.18.0).
pgbouncer_version() { "$(pgbouncer_bin)" --version | awk 'NR == 1 {print $2}'; }

# pgbouncer_conf writes the configuration. Startup parameters PgBouncer
# 1.18 does not track (search_path, options) are refused, not ignored: a
# client asking for a search_path gets an error instead of silently
# landing in another schema. Tests behind PgBouncer pick their schema
# with a role of their own (see internal/testenv/pgbouncer.go).
pgbouncer_conf() {
  cat >"$PGB_DIR/userlist.txt" <<USERS
"postgres" ""
USERS
  cat >"$PGB_CONF" <<CONF
[databases]
* = host=127.0.0.1 port=$PGB_SERVER_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGB_PORT
unix_socket_dir =
auth_type = trust
auth_file = $PGB_DIR/userlist.txt
; trust still needs a known user: users missing from auth_file (each
; test's own role) are looked up on the server.
auth_user = postgres
auth_query = SELECT usename, passwd FROM pg_shadow WHERE usename = \$1
admin_users = postgres
stats_users = postgres
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 60
; All pools together, whatever the user: PostgreSQL allows 300 and the
; suite also connects directly.
max_db_connections = 150
; Server connections of finished tests' roles go soon, freeing the above.
server_idle_timeout = 10
server_login_retry = 1
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
logfile = $PGB_LOG
pidfile = $PGB_PID
CONF
}

pgbouncer_up() {
  pgbouncer_install
  mkdir -p "$PGB_DIR"
  local old=; [[ -f $PGB_CONF ]] && old=$(cat "$PGB_CONF")
  pgbouncer_conf
  if pid_alive "$PGB_PID"; then
    if [[ $old != "$(cat "$PGB_CONF")" ]]; then
      log "pgbouncer: configuration changed, reloading"
      kill -HUP "$(cat "$PGB_PID")"
    fi
    log "pgbouncer: already running on 127.0.0.1:$PGB_PORT"
    return 0
  fi
  # Keep the log bounded across restarts.
  if [[ -f $PGB_LOG ]] && (($(stat -c %s "$PGB_LOG") > 64 << 20)); then
    tail -c $((1 << 20)) "$PGB_LOG" >"$PGB_LOG.tmp" && mv "$PGB_LOG.tmp" "$PGB_LOG"
  fi
  if [[ $(id -u) == 0 ]]; then
    touch "$PGB_LOG"
    chown postgres "$PGB_LOG"
    chown -R postgres "$PGB_DIR"
  fi
  log "pgbouncer: starting $(pgbouncer_version)"
  pgb_as_owner "$(pgbouncer_bin)" -d -q "$PGB_CONF"
  wait_port "$PGB_PORT" 30 pgbouncer
}

pgbouncer_down() {
  stop_pid "$PGB_PID" pgbouncer
}

pgbouncer_status() {
  if pid_alive "$PGB_PID"; then
    log "pgbouncer: running $(pgbouncer_version) on 127.0.0.1:$PGB_PORT (transaction pooling, server 127.0.0.1:$PGB_SERVER_PORT)"
  else
    log "pgbouncer: stopped"
  fi
}

pgbouncer_env() {
  echo "export NOLOCK_TEST_PGBOUNCER='postgres://postgres@127.0.0.1:$PGB_PORT/postgres?sslmode=disable'"
}
