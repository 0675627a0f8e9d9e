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
#      installed (comma-separated; an absolute path is a file that must exist, for a
#      package of jars), and the system services the package may start (comma-separated,
#      "-" for none). Adding a peer (activemq, ...) is adding one line. XStream, Jettison
#      and XPP3 are the jars ActiveMQ's STOMP `transformation` needs, which Debian's
#      activemq package leaves out (tests/peers/activemq.py puts them on its class path when
#      a test asks for transformations).
#   2. If every command is found, apt is not touched at all.
#   3. Otherwise (as root) it installs the missing packages with
#      `apt-get install -y --no-install-recommends`, running `apt-get update` only when apt
#      does not know a package yet or the first install attempt fails (stale lists).
#   4. Tests start private brokers on free loopback ports (tests/peers/*.py), so a system
#      service the package started (mosquitto on port 1883, ...) is stopped and disabled:
#      systemd when it runs, else the SysV init script, and, as a last resort, the process
#      named in the service's pid file. A systemd socket unit of the same name (epmd.socket)
#      is disabled too. epmd, the Erlang port mapper that rabbitmq-server (and even its init
#      script's `status`) starts on port 4369 of every interface, has neither init script
#      nor pid file: it is told to exit (`epmd -kill`) when no Erlang node is registered.
#   5. The rhea AMQP 1.0 client (npm, pinned by tests/peers/rhea/package-lock.json) is
#      installed into tests/peers/rhea/node_modules by `npm ci` when it is not there yet;
#      that needs no root, only npm and the npm registry.
#   Not root: nothing is installed; it says what to run and exits 0 so the unit tests still
#   run (the peer fixtures then fail with a message pointing back here).
set -euo pipefail

# package              commands (all must exist)        system services to keep stopped
PEERS=(
  "mosquitto           mosquitto                        mosquitto"
  "mosquitto-clients   mosquitto_pub,mosquitto_sub      -"
  "openssl             openssl                          -"
  "rabbitmq-server     rabbitmq-server,rabbitmqctl      rabbitmq-server,epmd"
  "nodejs              node                             -"
  "npm                 npm                              -"
  "default-jre-headless java                            -"
  "activemq            activemq                         activemq"
  "libxstream-java     /usr/share/java/xstream.jar      -"
  "libjettison-java    /usr/share/java/jettison.jar     -"
  "libxpp3-java        /usr/share/java/xpp3.jar         -"
  "chromium            chromium                         -"
  "systemd             systemd-analyze                  -"
  "nats-server         nats-server                      nats-server"
)

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Daemons live in /usr/sbin, which is not on a normal user's PATH.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

say() { printf 'peers/install.sh: %s\n' "$*" >&2; }

missing=()
services=()
for line in "${PEERS[@]}"; do
  read -r pkg cmds svc <<<"$line"
  if [[ "$svc" != "-" ]]; then
    IFS=, read -r -a svc_list <<<"$svc"
    services+=("${svc_list[@]}")
  fi
  IFS=, read -r -a cmd_list <<<"$cmds"
  for cmd in "${cmd_list[@]}"; do
    if [[ "$cmd" == /* ]]; then
      if [[ ! -e "$cmd" ]]; then
        missing+=("$pkg")
        break
      fi
    elif ! command -v "$cmd" >/dev/null 2>&1; then
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
  local svc=$1 pidfile pid unit
  if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
    # The socket unit first: it would start the service again on the next connection.
    for unit in "$svc.socket" "$svc.service"; do
      if systemctl is-active --quiet "$unit" 2>/dev/null \
          || systemctl is-enabled --quiet "$unit" 2>/dev/null; then
        say "stopping and disabling the system $unit (systemd)"
        systemctl disable --now "$unit" >/dev/null 2>&1 || true
      fi
    done
  elif [[ -x "/etc/init.d/$svc" ]]; then
    # Running means a live pid in its pid file: `service X status` may be slow (rabbitmqctl
    # boots an Erlang VM for it) and even start things (epmd).
    if service_pid "$svc" >/dev/null; then
      say "stopping the system $svc service (init script)"
      service "$svc" stop >/dev/null 2>&1 || true
    fi
    # Keep it from starting at the next boot; harmless when already disabled.
    if compgen -G "/etc/rc[2-5].d/S*$svc" >/dev/null; then
      update-rc.d "$svc" disable >/dev/null 2>&1 || true
    fi
  fi
  # Last resort: the daemon named in the package's pid file.
  if pid=$(service_pid "$svc"); then
    say "stopping the system $svc daemon (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
  fi
  [[ "$svc" == epmd ]] && stop_epmd
  return 0
}

# Print the live pid that a service's pid file names; fail when there is none.
service_pid() {
  local svc=$1 pidfile pid
  for pidfile in "/run/$svc/$svc.pid" "/run/$svc/pid" "/run/$svc.pid"; do
    [[ -r "$pidfile" ]] || continue
    pid=$(<"$pidfile")
    if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}

# The system epmd (port 4369, all interfaces) when it runs and serves no Erlang node: the
# private RabbitMQ nodes of tests/peers/rabbitmq.py run their own epmd on a free loopback port.
stop_epmd() {
  local names
  command -v epmd >/dev/null 2>&1 || return 0
  names=$(epmd -port 4369 -names 2>/dev/null) || return 0
  if grep -q '^name ' <<<"$names"; then
    say "note: the system epmd on port 4369 serves Erlang nodes; left running"
    return 0
  fi
  say "stopping the system epmd (port 4369)"
  epmd -port 4369 -kill >/dev/null 2>&1 || true
}

if is_root; then
  for svc in "${services[@]}"; do
    stop_service "$svc"
  done
fi

# rhea, the AMQP 1.0 client of the interop tests, at the version package-lock.json pins.
if [[ ! -d "$HERE/rhea/node_modules/rhea" ]]; then
  if ! command -v npm >/dev/null 2>&1; then
    say "npm is missing, so rhea is not installed; run this script as root"
  else
    say "installing rhea into $HERE/rhea/node_modules (npm ci)"
    if ! npm ci --prefix "$HERE/rhea" --no-audit --no-fund --loglevel=error >&2; then
      # Like a missing package when not root: the tests that need rhea say what to run.
      say "npm ci failed: rhea is not installed (the AMQP interop tests will fail until it is)"
    fi
  fi
fi

# Say so if something still listens on a well-known port of MQTT, AMQP, STOMP or epmd (the
# tests never use them).
for port in 1883 5672 61613 4369; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    say "note: something still listens on 127.0.0.1:$port (not started by this script's" \
        "packages, or not stoppable); the tests use their own free ports and ignore it"
  fi
done

((${#missing[@]})) && say "done: ${missing[*]} installed"
exit 0
