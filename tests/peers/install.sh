#!/usr/bin/env bash
# Install the real peer brokers and clients that the interop tests and the benchmarks use,
# from Debian's packages. Idempotent: when every command below is already on the machine it
# does nothing but check that no system broker service is running (the fast path, well under
# a second). The test command runs it before pytest; CI runs it as root on a clean machine.
#
#     bash tests/peers/install.sh
#
# How this works:
#   1. PEERS lists one peer per line: the Debian package, the commands that prove it is
#      installed (comma-separated), and the system service the package may start ("-" for
#      none). Adding a peer (rabbitmq-server, activemq, ...) is adding one line.
#   2. If every command is found, apt is not touched at all.
#   3. Otherwise (as root) it installs the missing packages with
#      `apt-get install -y --no-install-recommends`, running `apt-get update` only when apt
#      does not know a package yet or the first install attempt fails (stale lists).
#   4. Tests start private brokers on free loopback ports (tests/peers/*.py), so a system
#      service the package started (mosquitto on port 1883, ...) is stopped and disabled:
#      systemd when it runs, else the SysV init script, and, as a last resort, the process
#      named in the service's pid file.
#   Not root: nothing is installed; it says what to run and exits 0 so the unit tests still
#   run (the peer fixtures then fail with a message pointing back here).
set -euo pipefail

# package              commands (all must exist)        system service to keep stopped
PEERS=(
  "mosquitto           mosquitto                        mosquitto"
  "mosquitto-clients   mosquitto_pub,mosquitto_sub      -"
  "openssl             openssl                          -"
)

# Daemons live in /usr/sbin, which is not on a normal user's PATH.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

say() { printf 'peers/install.sh: %s\n' "$*" >&2; }

missing=()
services=()
for line in "${PEERS[@]}"; do
  read -r pkg cmds svc <<<"$line"
  [[ "$svc" != "-" ]] && services+=("$svc")
  IFS=, read -r -a cmd_list <<<"$cmds"
  for cmd in "${cmd_list[@]}"; do
    if ! command -v "$cmd" >/dev/null 2>&1; then
      missing+=("$pkg")
      break
    fi
  done
done

is_root() { [[ "$(id -u)" -eq 0 ]]; }

# apt knows a package when it has a candidate version in its lists.
apt_knows() {
  local pkg policy
  for pkg in "$@"; do
    policy=$(apt-cache policy "$pkg" 2>/dev/null) || return 1
    [[ "$policy" =~ Candidate:\ [^\(] ]] || return 1
  done
}

apt_install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

if ((${#missing[@]})); then
  if ! is_root; then
    say "missing: ${missing[*]}. Install them as root:"
    say "    sudo bash tests/peers/install.sh"
    say "(the interop tests and benchmarks that need these peers will fail until then)"
    exit 0
  fi
  say "installing: ${missing[*]}"
  updated=0
  if ! apt_knows "${missing[@]}"; then
    apt-get update -q
    updated=1
  fi
  if ! apt_install "${missing[@]}"; then
    ((updated)) && exit 1
    say "install failed; refreshing the package lists and retrying"
    apt-get update -q
    apt_install "${missing[@]}"
  fi
fi

# Keep each package's system service stopped and disabled: tests run private brokers.
stop_service() {
  local svc=$1 pidfile pid
  if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
    if systemctl is-active --quiet "$svc" 2>/dev/null \
        || systemctl is-enabled --quiet "$svc" 2>/dev/null; then
      say "stopping and disabling the system $svc service (systemd)"
      systemctl disable --now "$svc" >/dev/null 2>&1 || true
    fi
  elif [[ -x "/etc/init.d/$svc" ]]; then
    if service "$svc" status >/dev/null 2>&1; then
      say "stopping the system $svc service (init script)"
      service "$svc" stop >/dev/null 2>&1 || true
    fi
    # Keep it from starting at the next boot; harmless when already disabled.
    if compgen -G "/etc/rc[2-5].d/S*$svc" >/dev/null; then
      update-rc.d "$svc" disable >/dev/null 2>&1 || true
    fi
  fi
  # Last resort: the daemon named in the package's pid file.
  for pidfile in "/run/$svc/$svc.pid" "/var/run/$svc/$svc.pid" "/run/$svc.pid"; do
    [[ -r "$pidfile" ]] || continue
    pid=$(<"$pidfile")
    if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
      say "stopping the system $svc daemon (pid $pid from $pidfile)"
      kill "$pid" 2>/dev/null || true
      for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    fi
  done
}

if is_root; then
  for svc in "${services[@]}"; do
    stop_service "$svc"
  done
fi

# Say so if something still listens on MQTT's well-known port (tests never use it).
if (exec 3<>/dev/tcp/127.0.0.1/1883) 2>/dev/null; then
  say "note: something still listens on 127.0.0.1:1883 (not started by this script's" \
      "packages, or not stoppable); the tests use their own free ports and ignore it"
fi

((${#missing[@]})) && say "done: ${missing[*]} installed"
exit 0
