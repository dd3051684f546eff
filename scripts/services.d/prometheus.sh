# Prometheus from Debian's packages (2.42 on bookworm), private to the
# tests on 127.0.0.1:19090, with its own data dir. It scrapes every 1 s the
# targets listed in the files of $PROM_TARGETS (file-based service
# discovery, re-read every 1 s): a test writes a file naming the address
# of the /metrics it serves, queries the HTTP API, and removes the file.
# The package's system service is not used (no init in a container, and it
# would sit on 9090 with /var/lib/prometheus).
PROM_PORT=$(port 19090)
PROM_DIR=$NOLOCK_STATE/prometheus
PROM_TARGETS=$PROM_DIR/targets
PROM_PID=$NOLOCK_STATE/prometheus.pid
PROM_LOG=$NOLOCK_STATE/prometheus.log

prometheus_version() { prometheus --version 2>&1 | awk 'NR == 1 {print $3}'; }

prometheus_install() {
  command -v prometheus >/dev/null && return 0
  log "prometheus: installing the prometheus package (apt)"
  local sudo=; [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >&2
  command -v prometheus >/dev/null || die "prometheus: prometheus not found after install"
}

# prometheus_ours: the pid file names a running Prometheus of our data dir.
prometheus_ours() {
  pid_alive "$PROM_PID" || return 1
  tr '\0' ' ' <"/proc/$(cat "$PROM_PID")/cmdline" 2>/dev/null | grep -qF -- "--storage.tsdb.path=$PROM_DIR/data"
}

# prometheus_ready: GET /-/ready answers 200.
prometheus_ready() {
  local reply
  reply=$(timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$PROM_PORT &&
    printf 'GET /-/ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 && cat <&3" 2>/dev/null) || return 1
  [[ $reply == 'HTTP/1.0 200'* || $reply == 'HTTP/1.1 200'* ]]
}

prometheus_up() {
  prometheus_install
  if prometheus_ours; then
    log "prometheus: already running on 127.0.0.1:$PROM_PORT"
    return 0
  fi
  rm -f "$PROM_PID"
  if (exec 3<>"/dev/tcp/127.0.0.1/$PROM_PORT") 2>/dev/null; then
    die "127.0.0.1:$PROM_PORT is taken by a process not started by scripts/services"
  fi
  mkdir -p "$PROM_DIR/data" "$PROM_TARGETS"
  cat >"$PROM_DIR/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: nolock
    file_sd_configs:
      - files: ['$PROM_TARGETS/*.json']
        refresh_interval: 1s
YAML
  if [[ -f $PROM_LOG ]] && (($(stat -c %s "$PROM_LOG") > 64 << 20)); then
    tail -c $((1 << 20)) "$PROM_LOG" >"$PROM_LOG.tmp" && mv "$PROM_LOG.tmp" "$PROM_LOG"
  fi
  log "prometheus: starting $(prometheus_version)"
  echo "--- scripts/services: starting prometheus at $(date -u +%FT%TZ)" >>"$PROM_LOG"
  # An hour of samples is all a test reads; setsid keeps a Ctrl-C in the
  # calling shell from reaching it.
  setsid prometheus --config.file="$PROM_DIR/prometheus.yml" \
    --storage.tsdb.path="$PROM_DIR/data" --storage.tsdb.retention.time=1h \
    --web.listen-address="127.0.0.1:$PROM_PORT" \
    >>"$PROM_LOG" 2>&1 </dev/null &
  echo $! >"$PROM_PID"
  local i
  for ((i = 0; i < 600; i++)); do
    prometheus_ready && { log "prometheus: up on 127.0.0.1:$PROM_PORT (pid $(cat "$PROM_PID"))"; return 0; }
    if ! pid_alive "$PROM_PID"; then
      tail -n 20 "$PROM_LOG" >&2 || true
      rm -f "$PROM_PID"
      die "prometheus exited during start (log: $PROM_LOG)"
    fi
    sleep 0.1
  done
  die "prometheus not ready on 127.0.0.1:$PROM_PORT within 60s (log: $PROM_LOG)"
}

prometheus_down() {
  if prometheus_ours; then stop_pid "$PROM_PID" prometheus; else rm -f "$PROM_PID"; fi
}

prometheus_status() {
  if prometheus_ours; then
    log "prometheus: running $(prometheus_version) on 127.0.0.1:$PROM_PORT (pid $(cat "$PROM_PID"), targets $PROM_TARGETS)"
  else
    log "prometheus: stopped"
  fi
}

prometheus_env() {
  echo "export NOLOCK_TEST_PROMETHEUS=http://127.0.0.1:$PROM_PORT"
  echo "export NOLOCK_TEST_PROMETHEUS_TARGETS=$PROM_TARGETS"
}
