"""A nats-server running the configuration `mavjet auth init` writes, provisioned with admin creds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from nats.aio.client import Client

from mavjet.contract.natsconn import NatsOptions, connect_kwargs, open_client
from mavjet.ops import auth
from mavjet.ops.natsserver import DEV_CONFIG, NatsServer
from mavjet.ops.provision import DEFINITIONS_DIR, load_definitions, provision

ENV = "test"


@dataclass
class Secured:
    server: NatsServer
    dir: Path

    def creds(self, name: str) -> str:
        return str(self.dir / "creds" / f"{name}.creds")

    def options(self, name: str) -> NatsOptions:
        return NatsOptions(servers=(self.server.url,), creds_file=self.creds(name), connect_timeout_s=2.0)

    async def connect(self, name: str) -> Client:
        errors: list[Exception] = []

        async def keep(exc: Exception) -> None:
            errors.append(exc)

        nc = await open_client(**connect_kwargs(self.options(name), error_cb=keep, allow_reconnect=False))
        nc._mavjet_errors = errors  # type: ignore[attr-defined]
        return nc

    def log(self) -> str:
        return Path(self.server.log_file or "").read_text()


def secured_server(tmp_path: Path) -> Secured:
    d = tmp_path / "auth"
    auth.init(d, env=ENV, vehicles=["VID-001", "VID-002"], gateways={"hub": ["VID-003", "VID-004"]})
    conf = tmp_path / "server.conf"
    # nats-server resolves an include relative to the including file only
    conf.write_text(DEV_CONFIG + "include auth/auth.conf\n")
    srv = NatsServer(store_dir=str(tmp_path / "js"), config_file=str(conf), log_file=str(tmp_path / "nats.log"))
    srv.start()
    return Secured(server=srv, dir=d)


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    s = secured_server(tmp_path)
    try:
        yield s
    finally:
        s.server.stop()


@pytest.fixture
async def hub(secured: Secured) -> AsyncIterator[Secured]:
    admin = await secured.connect("admin")
    try:
        await provision(admin.jetstream(), load_definitions(DEFINITIONS_DIR, env=ENV, replicas=1))
    finally:
        await admin.close()
    yield secured
