from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mavjet.contract.errors import ConfigError
from mavjet.drivers.mavlink.transport import Endpoint
from mavjet.gateway.config import parse_vehicle
from mavjet.gateway.resolve import build_config


def test_endpoints_parse_and_reject() -> None:
    assert str(Endpoint.parse("tcp:127.0.0.1:5760")) == "tcp:127.0.0.1:5760"
    assert Endpoint.parse("serial:/dev/ttyACM0:57600").baud == 57600
    assert Endpoint.parse("udpin:0.0.0.0:14550").scheme == "udp"
    for bad in ("tcp:host", "ftp:x:1", "udp:127.0.0.1:99999", "serial:/dev/ttyS0"):
        with pytest.raises(ConfigError):
            Endpoint.parse(bad)


def test_toml_and_cli_merge() -> None:
    raw = {
        "env": "staging",
        "vehicles": [{"vid": "VID-001", "endpoint": "tcp:127.0.0.1:5760"}],
        "rates": {"position": 5},
        "nats": {"servers": ["nats://10.0.0.1:4222"]},
    }
    cfg = build_config(raw, vehicles=[parse_vehicle("VID-002=udp:127.0.0.1:14550")], nats={"servers": None})
    assert cfg.env == "staging" and [v.vid for v in cfg.vehicles] == ["VID-001", "VID-002"]
    assert cfg.rates_hz["position"] == 5.0 and cfg.rates_hz["attitude"] == 10.0
    assert cfg.nats.servers == ("nats://10.0.0.1:4222",)


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"vehicles": [{"vid": "VID 1", "endpoint": "tcp:a:1"}]}, "vehicles[0].vid"),
        ({"vehicles": [{"vid": "V", "endpoint": "tcp:a"}]}, "vehicles[0].endpoint"),
        ({"vehicles": [{"vid": "V", "endpoint": "tcp:a:1"}], "rates": {"position": 0}}, "rates.position"),
        ({"vehicles": [{"vid": "V", "endpoint": "tcp:a:1"}], "rates": {"warp": 1}}, "rates.warp"),
        ({"vehicles": [{"vid": "V", "endpoint": "tcp:a:1"}], "colour": "red"}, "colour"),
        ({"vehicles": [{"vid": "V", "endpoint": "tcp:a:1"}], "link": {"heartbeat_timeout_s": -1}}, "link.heartbeat_timeout_s"),
        ({"vehicles": [{"vid": "V", "endpoint": "tcp:a:1"}], "nats": {"servers": ["localhost"]}}, "nats.servers"),
        ({"vehicles": []}, "vehicles"),
        ({"vehicles": [{"vid": "V", "endpoint": "tcp:a:1"}, {"vid": "V", "endpoint": "tcp:a:2"}]}, "vehicles.vid"),
        ({"vehicles": [{"vid": "V", "endpoint": "tcp:a:1"}], "metrics": {"port": "x"}}, "metrics.port"),
    ],
)
def test_invalid_config_names_the_key(raw: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as ei:
        build_config(raw)
    assert ei.value.key == key


def test_cli_fails_at_start_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text('[[vehicles]]\nvid = "VID-001"\nendpoint = "tcp:127.0.0.1:5760"\n[rates]\nposition = 500\n')
    out = subprocess.run([sys.executable, "-m", "mavjet.ops", "gateway", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and "rates.position" in out.stderr
    cfg.write_text("this is = not [toml")
    out = subprocess.run([sys.executable, "-m", "mavjet.ops", "gateway", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and "not valid TOML" in out.stderr


def test_shadow_section_is_validated() -> None:
    base = {"vehicles": [{"vid": "V", "endpoint": "tcp:a:1"}]}
    cfg = build_config({**base, "shadow": {"verify_interval_s": 5}})
    assert cfg.shadow.verify_interval_s == 5
    with pytest.raises(ConfigError) as ei:
        build_config({**base, "shadow": {"colour": 1}})
    assert "shadow" in ei.value.key


def _write_config(tmp_path: Path) -> Path:
    path = tmp_path / "gw.toml"
    path.write_text('env = "file-env"\n[nats]\nservers = ["nats://file:4222"]\n'
                    '[[vehicles]]\nvid = "VID-001"\nendpoint = "tcp:127.0.0.1:5760"\n')
    return path


@pytest.mark.parametrize("style", ["equals", "separate"])
def test_nats_and_env_flags_beat_the_config_file(tmp_path: Path, style: str) -> None:
    from mavjet.gateway.entry import build_parser, config_from_args

    path = _write_config(tmp_path)
    argv = (["--config", str(path), "--nats=nats://flag:4222", "--env=flag-env"] if style == "equals"
            else ["--config", str(path), "--nats", "nats://flag:4222", "--env", "flag-env"])
    cfg = config_from_args(build_parser().parse_args(argv), environ={"MAVJET_NATS": "nats://envvar:4222",
                                                                     "MAVJET_ENV": "envvar-env"})
    assert cfg.nats.servers == ("nats://flag:4222",) and cfg.env == "flag-env"


def test_precedence_flag_env_file_default(tmp_path: Path) -> None:
    from mavjet.gateway.entry import build_parser, config_from_args

    path = _write_config(tmp_path)
    with_file = build_parser().parse_args(["--config", str(path)])
    # environment > file
    cfg = config_from_args(with_file, environ={"MAVJET_NATS": "nats://a:1,nats://b:2", "MAVJET_ENV": "envvar-env"})
    assert cfg.nats.servers == ("nats://a:1", "nats://b:2") and cfg.env == "envvar-env"
    # file > default
    cfg = config_from_args(with_file, environ={})
    assert cfg.nats.servers == ("nats://file:4222",) and cfg.env == "file-env"
    # default when nothing says otherwise
    bare = build_parser().parse_args(["--vehicle", "VID-001=tcp:127.0.0.1:5760"])
    cfg = config_from_args(bare, environ={})
    assert cfg.nats.servers == ("nats://127.0.0.1:4222",) and cfg.env == "prod"
    cfg = config_from_args(build_parser().parse_args(["--vehicle", "VID-001=tcp:127.0.0.1:5760", "--env=x"]),
                           environ={"MAVJET_ENV": "y"})
    assert cfg.env == "x"


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"commands": {"ack_timeout_s": "soon"}}, "commands.ack_timeout_s"),
        ({"commands": {"retries": 2.5}}, "commands.retries"),
        ({"commands": {"backoff_s": ["x"]}}, "commands.backoff_s"),
        ({"commands": {"consumer": "per-hub"}}, "commands.consumer"),
        ({"commands": {"max_ack_pending": 0}}, "commands.max_ack_pending"),
        ({"link": {"heartbeat_timeout_s": "x"}}, "link.heartbeat_timeout_s"),
        ({"link": {"streams_hz": {"ATTITUDE": "fast"}}}, "link.streams_hz.ATTITUDE"),
    ],
)
def test_wrong_types_name_their_own_key(section: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as ei:
        build_config({"vehicles": [{"vid": "V", "endpoint": "tcp:a:1"}], **section})
    assert ei.value.key == key


def test_command_consumer_shape_follows_the_fleet_unless_set() -> None:
    from mavjet.gateway.commands.consumer import mode_for
    from mavjet.gateway.config import ConsumerMode

    one = [{"vid": "V", "endpoint": "tcp:a:1"}]
    two = [*one, {"vid": "W", "endpoint": "tcp:a:2"}]
    assert mode_for(build_config({"vehicles": one})) is ConsumerMode.VEHICLE
    assert mode_for(build_config({"vehicles": two})) is ConsumerMode.GATEWAY
    assert mode_for(build_config({"vehicles": one, "commands": {"consumer": "gateway"}})) is ConsumerMode.GATEWAY
    assert mode_for(build_config({"vehicles": two, "commands": {"consumer": "vehicle"}})) is ConsumerMode.VEHICLE


def test_shadow_uses_commands_protocol_config(tmp_path: Path) -> None:
    """Shadow-driven MAVLink commands honour `[commands]`: one protocol config for both services."""
    from mavjet.gateway.daemon import Gateway, with_services
    from mavjet.gateway.shadow.service import ShadowService

    cfg = build_config({
        "vehicles": [{"vid": "V", "endpoint": "tcp:127.0.0.1:1"}], "state_dir": str(tmp_path),
        "commands": {"ack_timeout_s": 0.7, "retries": 5, "in_progress_timeout_s": 12},
    })
    assert cfg.protocols.command.ack_timeout_s == 0.7
    assert cfg.protocols.command.max_attempts == 6
    assert cfg.protocols.command.in_progress_timeout_s == 12.0
    gw = with_services(Gateway(cfg), commands=False, shadow=True)
    assert any(isinstance(e, ShadowService) for e in gw.services)
    # The shadow acts through each vehicle's session, which carries the [commands] protocol config.
    assert gw.twins["V"].session.protocols == cfg.protocols


def test_nats_host_port_as_the_nats_cli_takes_it_and_errors_name_their_source() -> None:
    from mavjet.gateway.resolve import resolve_config

    flags = {"vehicle": ["VID-001=tcp:127.0.0.1:5760"]}
    cfg = resolve_config({}, flags={**flags, "nats": "127.0.0.1:14222"}, environ={})
    assert cfg.nats.servers == ("nats://127.0.0.1:14222",)
    cfg = resolve_config({}, flags=flags, environ={"MAVJET_NATS": "hub-1:4222,nats://hub-2:4222"})
    assert cfg.nats.servers == ("nats://hub-1:4222", "nats://hub-2:4222")
    with pytest.raises(ConfigError) as flag:
        resolve_config({}, flags={**flags, "nats": "127.0.0.1:notaport"}, environ={})
    assert flag.value.key == "--nats" and "HOST:PORT" in flag.value.reason
    with pytest.raises(ConfigError) as env:
        resolve_config({}, flags=flags, environ={"MAVJET_NATS": "ftp://x:1"})
    assert env.value.key == "MAVJET_NATS"


def test_backup_link_from_the_command_line_and_the_file() -> None:
    from mavjet.gateway.resolve import resolve_config

    cfg = resolve_config({}, flags={"vehicle": ["VID-001=tcp:127.0.0.1:5760"],
                                    "backup": ["VID-001=tcp:127.0.0.1:5762"]}, environ={})
    assert cfg.vehicles[0].backup == Endpoint.parse("tcp:127.0.0.1:5762")
    raw = {"vehicles": [{"vid": "VID-002", "endpoint": "tcp:127.0.0.1:5770", "backup": "udpout:10.0.0.5:14550"}]}
    assert build_config(raw).vehicles[0].backup == Endpoint.parse("udpout:10.0.0.5:14550")
    with pytest.raises(ConfigError, match="not a vehicle of this gateway"):
        resolve_config({}, flags={"vehicle": ["VID-001=tcp:127.0.0.1:5760"],
                                  "backup": ["VID-009=tcp:127.0.0.1:5762"]}, environ={})
