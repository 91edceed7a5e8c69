"""castmesh.config: the settings table from Python (Monarch's configure /
configured / get_global_config), its errors, the environment check at
start-up, and settings reaching procs spawned afterwards."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import castmesh
import castmesh.config as config
from castmesh import Actor, endpoint, this_host


@pytest.fixture(autouse=True)
def empty_runtime_layer():
    config.clear_runtime_config()
    yield
    config.clear_runtime_config()


def test_defaults_and_types():
    settings = config.get_global_config()
    assert settings["shm"] is True
    assert settings["shm_spin_us"] == 1000
    assert settings["shm_spin_oversubscribed_us"] is None
    assert settings["shm_spin_yield"] == "auto"
    assert settings["rdma_fallback"] == "auto"
    assert settings["rdma_chunk_bytes"] == 1 << 20
    assert settings["max_message_bytes"] == 1 << 30
    assert settings["rdma_device"] == ""
    assert config.get_runtime_config() == {}


def test_configure_round_trip():
    config.configure(shm_spin_us=50, rdma_fallback="error", single_copy=False, shm_spin_yield=True)
    assert config.get_runtime_config() == {"shm_spin_us": 50, "shm_spin_yield": "1", "single_copy": False,
                                           "rdma_fallback": "error"}
    settings = config.get_global_config()
    assert (settings["shm_spin_us"], settings["rdma_fallback"], settings["single_copy"]) == (50, "error", False)
    config.configure(shm_spin_us=60)  # adds to the layer
    assert config.get_runtime_config()["shm_spin_us"] == 60
    assert config.get_runtime_config()["rdma_fallback"] == "error"
    config.clear_runtime_config()
    assert config.get_global_config()["shm_spin_us"] == 1000
    assert castmesh.config is config


def test_configured_restores_the_runtime_layer():
    config.configure(socket_spin_us=10)
    with config.configured(socket_spin_us=20, rdma_chunk_bytes=4096) as merged:
        assert merged["socket_spin_us"] == 20 and merged["rdma_chunk_bytes"] == 4096
        with config.configured(socket_spin_us=30):
            assert config.get_global_config()["socket_spin_us"] == 30
        assert config.get_global_config()["socket_spin_us"] == 20
    assert config.get_runtime_config() == {"socket_spin_us": 10}
    with pytest.raises(RuntimeError, match="inside"):
        with config.configured(rdma_fallback="error"):
            raise RuntimeError("inside")
    assert config.get_runtime_config() == {"socket_spin_us": 10}


def test_unknown_names_and_malformed_values_raise_and_change_nothing():
    config.configure(shm_spin_us=5)
    with pytest.raises(ValueError, match="did you mean shm_spin_us"):
        config.configure(shm_spin_uz=50)
    with pytest.raises(ValueError, match="CASTMESH_SHM_SPIN_US='2000000'"):
        config.configure(rdma_chunk_bytes=4096, shm_spin_us=2_000_000)
    with pytest.raises(ValueError, match="auto or error"):
        config.configure(rdma_fallback="sometimes")
    with pytest.raises(TypeError, match="an int"):
        config.configure(socket_spin_us="fast")
    with pytest.raises(TypeError, match="a bool"):
        config.configure(rdma_chunk_bytes=True)
    with pytest.raises(ValueError, match="did you mean"):
        with config.configured(shm_spinn_us=1):
            pass  # never runs
    assert config.get_runtime_config() == {"shm_spin_us": 5}


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CASTMESH_") or k.startswith("CASTMESH_TEST_")}
    return subprocess.run([sys.executable, "-c", code], env=dict(clean, **env), capture_output=True, text=True,
                          timeout=60)


def test_environment_is_read_and_checked_at_start_up():
    ok = _python("import castmesh.config as c; print(c.get_global_config()['shm_spin_us'])",
                 CASTMESH_SHM_SPIN_US="70")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "70"
    # An unknown CASTMESH_ variable (a typo) and a malformed value are errors, not silent defaults.
    typo = _python("import castmesh.config as c; c.get_global_config()", CASTMESH_SHM_SPIN_UZ="70")
    assert typo.returncode != 0
    assert "ValueError" in typo.stderr and "did you mean CASTMESH_SHM_SPIN_US" in typo.stderr
    bad = _python("import castmesh.config as c; c.get_global_config()", CASTMESH_RDMA_FALLBACK="sometimes")
    assert "CASTMESH_RDMA_FALLBACK='sometimes'" in bad.stderr
    # Starting a runtime fails with it too.
    start = _python("import castmesh; castmesh.this_host().spawn_procs(per_host={\"gpus\": 1})",
                    CASTMESH_SOCKET_WAIT="perhaps")
    assert start.returncode != 0
    assert "CASTMESH_SOCKET_WAIT='perhaps'" in start.stderr
    # The launcher's variables are not settings and pass the check.
    launcher = _python("import castmesh.config as c; c.get_global_config()", CASTMESH_LOG="warn",
                       CASTMESH_JOIN_TIMEOUT="5", CASTMESH_REQUIRE_NETNS="1")
    assert launcher.returncode == 0, launcher.stderr


class Probe(Actor):
    @endpoint
    def settings(self) -> dict:
        return config.get_global_config()


@pytest.mark.timeout(120)
def test_procs_spawned_afterwards_get_the_runtime_layer():
    before = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        with config.configured(socket_spin_us=77, rdma_fallback="error"):
            after = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            seen = after.spawn("probe", Probe).settings.call_one().get(timeout=60)
            assert (seen["socket_spin_us"], seen["rdma_fallback"]) == (77, "error")
            # Procs started before keep what they started with.
            seen = before.spawn("probe", Probe).settings.call_one().get(timeout=60)
            assert (seen["socket_spin_us"], seen["rdma_fallback"]) == (200, "auto")
        finally:
            after.stop().get(timeout=60)
    finally:
        before.stop().get(timeout=60)
