"""macOS and Windows (no such machine here): what `init_options` sets for gloo there, faked with platform.system()."""

import os
import platform

import pytest

from distrinews.ddp import init_options

GLOO_VARS = ("GLOO_SOCKET_IFNAME", "USE_LIBUV", "MASTER_ADDR")


@pytest.mark.parametrize(
    "system, master, expected",
    [
        ("Darwin", None, {"GLOO_SOCKET_IFNAME": "lo0"}),  # torchrun --standalone: this machine's loopback
        ("Darwin", "localhost", {"GLOO_SOCKET_IFNAME": "lo0", "MASTER_ADDR": "localhost"}),
        ("Darwin", "10.0.0.1", {"MASTER_ADDR": "10.0.0.1"}),  # several machines: lo0 would be wrong, left to the user
        ("Windows", None, {"USE_LIBUV": "0"}),
        ("Linux", None, {}),
    ],
)
def test_init_options_sets_what_gloo_needs_on_each_system(system, master, expected, monkeypatch):
    for var in GLOO_VARS:  # unset for the test, and as they were after it: init_options sets them in os.environ
        monkeypatch.setenv(var, "")  # (delenv alone records nothing for an unset variable: what is set here would stay)
        monkeypatch.delenv(var)
    if master:
        monkeypatch.setenv("MASTER_ADDR", master)
    monkeypatch.setattr(platform, "system", lambda: system)
    init_options(60)
    assert {v: os.environ[v] for v in GLOO_VARS if v in os.environ} == expected


def test_a_variable_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "en0")
    monkeypatch.setenv("MASTER_ADDR", "")
    monkeypatch.delenv("MASTER_ADDR")
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    init_options(60)
    assert os.environ["GLOO_SOCKET_IFNAME"] == "en0"
