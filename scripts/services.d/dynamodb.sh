# scripts/services.d/dynamodb.sh: DynamoDB-API servers on loopback, sourced by
# scripts/services (which provides log, die, pid_alive, wait_port, stop_pid,
# $NOLOCK_CACHE and $NOLOCK_STATE). Functions only: nothing runs on source.
#
# Two servers, because neither does everything right:
#   dynalite (npm)  127.0.0.1:18000  NOLOCK_TEST_DYNAMODB     default: atomic
#                   conditional writes, fast; no transactions, no TTL.
#   moto (PyPI)     127.0.0.1:18001  NOLOCK_TEST_DYNAMODB_TX  transactions, TTL,
#                   ReturnValuesOnConditionCheckFailure; its own server loses
#                   updates when threaded, so it runs under moto_serial.py,
#                   which handles one request at a time.
# Amazon's DynamoDB Local is deliberately not used (its licence).
# Both keep their data in memory: a restart empties them.

# _ddb_vars: the pinned versions, ports and paths (set here so sourcing stays inert).
_ddb_vars() {
  _ddb_dynalite_ver=4.0.0
  _ddb_dynalite_port=$(port 18000)
  _ddb_dynalite_dir=$NOLOCK_CACHE/dynalite-$_ddb_dynalite_ver
  _ddb_dynalite_pid=$NOLOCK_STATE/dynalite.pid
  _ddb_dynalite_log=$NOLOCK_STATE/dynalite.log

  _ddb_moto_ver=5.2.5
  _ddb_moto_port=$(port 18001)
  _ddb_moto_dir=$NOLOCK_CACHE/moto-$_ddb_moto_ver
  _ddb_moto_pid=$NOLOCK_STATE/moto.pid
  _ddb_moto_log=$NOLOCK_STATE/moto.log
  _ddb_moto_launcher=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/moto_serial.py
  # dynalite_serve.js: dynalite's cli, minus the crash on a client abort.
  _ddb_dynalite_launcher=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/dynalite_serve.js
}

# _ddb_now: seconds since the epoch with milliseconds, for timings in the log.
_ddb_now() { date +%s.%3N; }
_ddb_since() { awk -v a="$1" -v b="$(_ddb_now)" 'BEGIN { printf "%.1f", b - a }'; }

# _ddb_port_busy PORT: something accepts connections on 127.0.0.1:PORT.
_ddb_port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# _ddb_ours PIDFILE NEEDLE: the pid in PIDFILE runs a command line containing
# NEEDLE. Guards against a stale pid file (/var/tmp outlives a reboot) whose
# pid now belongs to an unrelated process.
_ddb_ours() {
  pid_alive "$1" || return 1
  tr '\0' ' ' <"/proc/$(cat "$1")/cmdline" 2>/dev/null | grep -qF -- "$2"
}

# _ddb_wait PORT SECS NAME PIDFILE LOG: like wait_port, but gives up at once
# (showing the log) if the server died, instead of waiting out the timeout.
_ddb_wait() {
  local port=$1 secs=$2 name=$3 pidfile=$4 logfile=$5 i
  for ((i = 0; i < secs * 10; i++)); do
    _ddb_port_busy "$port" && return 0
    if ! pid_alive "$pidfile"; then
      tail -n 20 "$logfile" >&2 || true
      rm -f "$pidfile"
      die "$name exited during start (log: $logfile)"
    fi
    sleep 0.1
  done
  tail -n 20 "$logfile" >&2 || true
  die "$name did not open 127.0.0.1:$port within ${secs}s (log: $logfile)"
}

# _ddb_start NAME PORT PIDFILE LOG SECS NEEDLE CMD...: start CMD detached in
# the background unless it already runs (see _ddb_ours); record its pid; wait
# for the port.
_ddb_start() {
  local name=$1 port=$2 pidfile=$3 logfile=$4 secs=$5 needle=$6 t0
  shift 6
  if _ddb_ours "$pidfile" "$needle"; then
    log "dynamodb: $name already running (pid $(cat "$pidfile"))"
    _ddb_wait "$port" "$secs" "$name" "$pidfile" "$logfile"
    return 0
  fi
  rm -f "$pidfile"
  # A stranger on our port would answer the tests in our place.
  _ddb_port_busy "$port" && die "127.0.0.1:$port is taken by a process not started by scripts/services"
  t0=$(_ddb_now)
  echo "--- scripts/services: starting $name at $(date -u +%FT%TZ)" >>"$logfile"
  # setsid: own session, so a Ctrl-C in the calling shell does not reach it;
  # it execs, so $! is the server's own pid.
  setsid "$@" >>"$logfile" 2>&1 </dev/null &
  echo $! >"$pidfile"
  _ddb_wait "$port" "$secs" "$name" "$pidfile" "$logfile"
  log "dynamodb: $name up on 127.0.0.1:$port (pid $(cat "$pidfile")) in $(_ddb_since "$t0")s"
}

# _ddb_install_dynalite: npm install into the cache, once. The stamp file is
# written last, so an interrupted install is redone rather than trusted.
# dynalite 4 keeps in-memory tables in memory-level; it still loads
# classic-level (native), whose npm package ships prebuilt linux-x64 binaries,
# so no compiler is needed.
_ddb_install_dynalite() {
  local t0
  [[ -e $_ddb_dynalite_dir/.nolock-installed ]] && return 0
  command -v npm >/dev/null || die "dynamodb: npm not found (needed for dynalite)"
  log "dynamodb: installing dynalite $_ddb_dynalite_ver (npm) into $_ddb_dynalite_dir"
  t0=$(_ddb_now)
  rm -rf "$_ddb_dynalite_dir"
  mkdir -p "$_ddb_dynalite_dir"
  npm install --prefix "$_ddb_dynalite_dir" --no-audit --no-fund --loglevel=error \
    "dynalite@$_ddb_dynalite_ver" >&2 || die "dynamodb: npm install dynalite@$_ddb_dynalite_ver failed"
  # Fail here, not at start, if the native module cannot load.
  (cd "$_ddb_dynalite_dir" && node -e "require('dynalite')") >&2 \
    || die "dynamodb: dynalite installed but does not load"
  touch "$_ddb_dynalite_dir/.nolock-installed"
  log "dynamodb: dynalite $_ddb_dynalite_ver installed in $(_ddb_since "$t0")s"
}

# _ddb_install_moto: a venv with moto[server] pinned, once (stamp as above).
_ddb_install_moto() {
  local t0
  [[ -e $_ddb_moto_dir/.nolock-installed ]] && return 0
  command -v python3 >/dev/null || die "dynamodb: python3 not found (needed for moto)"
  log "dynamodb: installing moto[server] $_ddb_moto_ver (PyPI) into $_ddb_moto_dir"
  t0=$(_ddb_now)
  rm -rf "$_ddb_moto_dir"
  python3 -m venv "$_ddb_moto_dir" || die "dynamodb: python3 -m venv failed"
  "$_ddb_moto_dir/bin/pip" install --quiet --disable-pip-version-check \
    "moto[server]==$_ddb_moto_ver" >&2 || die "dynamodb: pip install moto[server]==$_ddb_moto_ver failed"
  touch "$_ddb_moto_dir/.nolock-installed"
  log "dynamodb: moto $_ddb_moto_ver installed in $(_ddb_since "$t0")s"
}

dynamodb_up() {
  _ddb_vars
  _ddb_install_dynalite
  _ddb_install_moto
  # In memory (no --path); --host keeps it off every interface but loopback
  # (dynalite's default is all of them); tables become active at once instead
  # of after the default 500 ms, which every test would otherwise wait for.
  _ddb_start "dynalite $_ddb_dynalite_ver" "$_ddb_dynalite_port" "$_ddb_dynalite_pid" \
    "$_ddb_dynalite_log" 30 "dynalite_serve.js" \
    node "$_ddb_dynalite_launcher" "$_ddb_dynalite_dir" \
    --host 127.0.0.1 --port "$_ddb_dynalite_port" \
    --createTableMs 0 --deleteTableMs 0 --updateTableMs 0
  # MOTO_PORT: moto builds some URLs from it; -u: log lines appear at once.
  _ddb_start "moto $_ddb_moto_ver (serialised)" "$_ddb_moto_port" "$_ddb_moto_pid" \
    "$_ddb_moto_log" 120 "moto_serial.py" \
    env MOTO_PORT="$_ddb_moto_port" "$_ddb_moto_dir/bin/python" -u "$_ddb_moto_launcher" \
    --host 127.0.0.1 --port "$_ddb_moto_port"
}

# _ddb_stop PIDFILE NEEDLE NAME: stop it if it is ours; forget a stale pid file.
_ddb_stop() {
  if _ddb_ours "$1" "$2"; then stop_pid "$1" "$3"; else rm -f "$1"; fi
}

dynamodb_down() {
  _ddb_vars
  _ddb_stop "$_ddb_dynalite_pid" "dynalite_serve.js" "dynalite"
  _ddb_stop "$_ddb_moto_pid" "moto_serial.py" "moto"
}

# _ddb_status_line NAME PORT PIDFILE NEEDLE
_ddb_status_line() {
  if _ddb_ours "$3" "$4"; then
    log "dynamodb: running $1 on http://127.0.0.1:$2 (pid $(cat "$3"))"
  else
    log "dynamodb: $1 stopped"
  fi
}

dynamodb_status() {
  _ddb_vars
  _ddb_status_line "dynalite $_ddb_dynalite_ver" "$_ddb_dynalite_port" "$_ddb_dynalite_pid" "dynalite_serve.js"
  _ddb_status_line "moto $_ddb_moto_ver (serialised)" "$_ddb_moto_port" "$_ddb_moto_pid" "moto_serial.py"
}

dynamodb_env() {
  _ddb_vars
  echo "export NOLOCK_TEST_DYNAMODB=http://127.0.0.1:$_ddb_dynalite_port"
  echo "export NOLOCK_TEST_DYNAMODB_TX=http://127.0.0.1:$_ddb_moto_port"
  # For tests that start (and crash) a dynalite of their own: testenv.DynamoDBServer.
  echo "export NOLOCK_TEST_DYNALITE='$_ddb_dynalite_launcher $_ddb_dynalite_dir'"
}
