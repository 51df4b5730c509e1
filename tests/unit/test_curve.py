"""CURVE keys from the run's secret, the addresses that stay on this host, the warning for a
plain transport on a network, the --encrypt flag, and shared memory offered on loopback only."""

from __future__ import annotations

import hashlib
import hmac
import os

import numpy as np
import pytest
import zmq
from zmq.utils import z85

from ember.algorithms.rules import SGDRule
from ember.cli import build_parser
from ember.config import make_config
from ember.errors import ConfigError
from ember.wire import ClientConnection, ServerEndpoint, curve, shared
from ember.wire.hosts import endpoint_is_local, host_of, is_loopback
from tests.conftest import SECRET, running_servers, transport


def test_keys_are_derived_from_the_secret_and_differ_between_runs_and_roles() -> None:
    keys, again, other = (
        curve.run_keys(SECRET),
        curve.run_keys(bytes(SECRET)),
        curve.run_keys(b"t" * 32),
    )
    assert keys == again
    assert len({keys.server_secret, keys.client_secret, other.server_secret}) == 3
    assert keys.server_public == zmq.curve_public(keys.server_secret)
    assert keys.client_public == zmq.curve_public(keys.client_secret)
    assert keys.domain != other.domain
    assert keys.server_secret.decode() not in keys.domain
    # What every process of the run derives on its own, from nothing but the secret:
    for key, role in ((keys.server_secret, b"curve-server"), (keys.client_secret, b"curve-client")):
        assert z85.decode(key) == hmac.new(SECRET, role, hashlib.sha256).digest()


@pytest.mark.parametrize(
    ("endpoint", "host", "local"),
    [
        ("tcp://127.0.0.1:5555", "127.0.0.1", True),
        ("tcp://127.3.2.1:5555", "127.3.2.1", True),
        ("tcp://localhost:5555", "localhost", True),
        ("tcp://[::1]:5555", "::1", True),
        ("tcp://[::ffff:127.0.0.1]:5555", "::ffff:127.0.0.1", True),
        ("tcp://198.18.0.2:5555", "198.18.0.2", False),
        ("tcp://0.0.0.0:5555", "0.0.0.0", False),  # listening on every interface
        ("tcp://[fe80::1%eth0]:5555", "fe80::1%eth0", False),
        ("tcp://driver.example:5555", "driver.example", False),  # a name proves nothing
        ("ipc:///tmp/ember.sock", "", True),
        ("inproc://ember", "", True),
    ],
)
def test_only_loopback_and_host_bound_transports_stay_on_this_host(
    endpoint: str, host: str, local: bool
) -> None:
    assert host_of(endpoint) == host
    assert endpoint_is_local(endpoint) is local


def test_peer_addresses_outside_loopback_are_not_loopback() -> None:
    for address in ("", "(unknown)", "10.0.0.1", "::", "198.18.0.255", "127.0.0.1.example"):
        assert not is_loopback(address), address


def test_a_plain_transport_beyond_loopback_warns_once_naming_the_exposure() -> None:
    said: list[str] = []
    remote = ["tcp://127.0.0.1:5000", "tcp://198.18.0.2:5001"]
    warning = curve.warn_if_exposed(remote, encrypt=False, say=said.append)
    assert said == [warning]
    assert warning is not None
    assert "tcp://198.18.0.2:5001" in warning and "127.0.0.1" not in warning
    assert "in clear" in warning and "--encrypt off" in warning
    assert curve.warn_if_exposed(remote, encrypt=True, say=said.append) is None
    assert curve.warn_if_exposed(remote[:1], encrypt=False, say=said.append) is None
    assert len(said) == 1


def test_encrypt_is_on_by_default_and_set_by_flag_and_yaml(tmp_path) -> None:
    parser = build_parser()
    fields = vars(parser.parse_args(["train", "--encrypt", "off"]))
    assert make_config({"encrypt": fields["encrypt"]}).encrypt is False
    assert make_config({}).encrypt is True
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--encrypt", "maybe"])
    config = tmp_path / "run.yaml"
    config.write_text("encrypt: off\n")
    assert make_config({}, str(config)).encrypt is False
    config.write_text("encrypt: 3\n")
    with pytest.raises(ConfigError, match="encrypt must be bool"):
        make_config({}, str(config))


def test_the_process_setting_decides_unless_overridden() -> None:
    with transport(False):
        endpoint = ServerEndpoint(SECRET)
        forced = ServerEndpoint(SECRET, encrypt=True)
        assert (endpoint.encrypted, forced.encrypted) == (False, True)
        endpoint.close()
        forced.close()
    endpoint = ServerEndpoint(SECRET)
    assert endpoint.encrypted is True
    endpoint.close()


class _Frame:
    """What the endpoint reads of a zmq frame: where the peer's bytes came from."""

    def __init__(self, peer: str | None) -> None:
        self._peer = peer

    def get(self, name: str) -> str:
        if name != "Peer-Address" or self._peer is None:
            raise zmq.ZMQError(zmq.EINVAL)
        return self._peer


@pytest.mark.skipif(not shared.enabled(), reason="needs /dev/shm")
def test_the_server_maps_a_region_only_for_a_peer_on_loopback() -> None:
    endpoint = ServerEndpoint(SECRET)
    try:
        header = {"op": "attach", "bytes": 8192}
        for peer in ("198.18.0.2", "10.1.2.3", None):
            answer = endpoint._attach(b"peer", header, _Frame(peer))
            assert answer["attached"] is False
            assert "not on loopback" in answer["reason"]
        assert endpoint.rejected["remote_region"] == 3
        answer = endpoint._attach(b"peer", header, _Frame("127.0.0.1"))
        assert answer["attached"] is True and answer["bytes"] == 8192
        assert endpoint.shared_memory["peers"] == 1
    finally:
        endpoint.close()


@pytest.mark.skipif(not shared.enabled(), reason="needs /dev/shm")
def test_a_client_offers_no_region_to_a_server_it_reached_beyond_loopback() -> None:
    with running_servers(np.zeros(4, dtype=np.float32), SGDRule(lr=1.0)) as (server,):
        connection = ClientConnection(server.address, SECRET, timeout=5)
        before = set(os.listdir(shared.SHM_DIR))
        # The address it was given decides: the same server named by another host's address
        # (which this test may not dial) gets no offer, and no region is made.
        connection.address = "tcp://198.18.0.2:" + server.address.rsplit(":", 1)[1]
        assert connection.share_memory(4096) is False
        assert set(os.listdir(shared.SHM_DIR)) == before
        connection.address = server.address
        assert connection.share_memory(4096) is True
        connection.close()
