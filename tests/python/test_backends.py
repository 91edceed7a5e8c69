"""castmesh.backends() and friends, from the build tree or an installed wheel."""

import os
import subprocess
import sys
import textwrap

import pytest

import castmesh


def by_name():
    return {info.name: info for info in castmesh.backends()}


def test_version_is_the_core_library_version():
    assert castmesh.__version__ == castmesh._castmesh.version()
    assert castmesh.__version__.count(".") == 2


def test_well_known_backends_are_always_listed_with_a_state():
    found = by_name()
    assert {"rdma", "tensor_engine"} <= found.keys()
    for info in found.values():
        assert info.state in {
            "loaded", "library missing", "no driver", "no device",
            "ABI mismatch", "invalid library", "duplicate", "init failed",
        }
        assert info.available == (info.state == "loaded")
        assert info.found == (info.state != "library missing")
        if not info.available:
            assert info.message, f"{info.name} is unavailable without a reason"


def test_missing_backend_says_how_to_install_it():
    missing = [info for info in castmesh.backends() if not info.found]
    for info in missing:
        assert "pip install" in info.message
    with pytest.raises(RuntimeError, match="not_a_backend"):
        castmesh.load_backend("not_a_backend")


@pytest.mark.skipif(not os.path.exists(os.path.join(os.environ.get("CASTMESH_TEST_BACKEND_DIR", "/nonexistent"),
                                                    "libcastmesh_rdma.so")),
                    reason="rdma backend not built in this tree")
def test_rdma_backend_built_here_is_found():
    rdma = by_name()["rdma"]
    assert rdma.found
    assert rdma.path.endswith("libcastmesh_rdma.so")
    if not rdma.available:
        assert rdma.state == "no device"
        assert "no RDMA device" in rdma.message
        with pytest.raises(RuntimeError, match="no RDMA device"):
            castmesh.load_backend("rdma")
    else:
        assert all(device.kind == "rdma_nic" for device in rdma.devices)


def test_broken_plugin_package_warns_instead_of_failing_import(tmp_path):
    # A fake installed distribution whose castmesh.backends entry point raises.
    dist = tmp_path / "castmesh_brokenplugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: castmesh-brokenplugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[castmesh.backends]\nbroken = castmesh_brokenplugin:library_path\n")
    (tmp_path / "castmesh_brokenplugin.py").write_text("def library_path():\n    raise OSError('gone')\n")
    script = textwrap.dedent("""
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import castmesh
        assert any("broken" in str(w.message) for w in caught), [str(w.message) for w in caught]
        assert castmesh.backends()
        print("ok")
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_plugin_entry_point_path_is_searched(tmp_path):
    # A plugin package registered through the entry point group: its library
    # (a copy of the rdma plugin, or a non-library file) is what discovery sees.
    dist = tmp_path / "castmesh_fakeplugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: castmesh-fakeplugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[castmesh.backends]\nfake = castmesh_fakeplugin:library_path\n")
    library = tmp_path / "libcastmesh_fake.so"
    library.write_text("not an ELF file")
    (tmp_path / "castmesh_fakeplugin.py").write_text(
        f"def library_path():\n    return {str(library)!r}\n")
    script = textwrap.dedent("""
        import castmesh
        fake = {b.name: b for b in castmesh.backends()}["fake"]
        print(fake.state, "|", fake.message)
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    state, message = result.stdout.strip().split(" | ", 1)
    assert state == "invalid library"
    assert "not a loadable library" in message


def test_extension_does_not_link_libpython():
    extension = castmesh._castmesh.__file__
    output = subprocess.run(["ldd", extension], capture_output=True, text=True, check=True).stdout
    assert "libpython" not in output, output
