"""The kernel cache's key (minidl.kernels.loader): CuPy keys its disk cache on the .cu text and
the options, so the options carry a hash of the .cu and every header it includes. An edit of a
header a family includes must change that family's options, and only that family's."""
import shutil

import pytest

from minidl.kernels import FAMILIES, loader


@pytest.fixture
def sources(tmp_path, monkeypatch):
    """A copy of kernels/ that the loader reads instead of the real one."""
    copy = tmp_path / "kernels"
    shutil.copytree(loader.source_dir(), copy)
    monkeypatch.setattr(loader, "source_dir", lambda: copy)
    return copy


def options(family):
    return loader.compile_options(FAMILIES[family].DEFINES, family)


def edit(path):
    path.write_text(path.read_text() + "\n// an edit\n")


@pytest.mark.parametrize("header", ["ptx.cuh", "conv_v2_norm.cuh"])
def test_a_header_edit_changes_the_options_of_the_family_including_it(sources, header):
    before, other = options("conv_v2"), options("pool")
    everything = loader.all_sources_hash()
    edit(sources / header)
    assert options("conv_v2") != before
    assert options("pool") == other  # pool.cu includes neither header
    assert loader.all_sources_hash() != everything


def test_an_unrelated_edit_leaves_the_options_alone(sources):
    before = options("conv_v2")
    everything = loader.all_sources_hash()
    edit(sources / "pool.cu")
    (sources / "notes.txt").write_text("not a kernel source")
    assert options("conv_v2") == before
    assert loader.all_sources_hash() != everything  # pool.cu is a kernel source


def test_a_launcher_edit_changes_the_hash_of_every_source(sources, tmp_path, monkeypatch):
    """Grids, tiles and shared-memory sizes live in minidl/kernels/*.py: an edit validates anew."""
    launchers = tmp_path / "launchers"
    shutil.copytree(loader.LAUNCHERS, launchers, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(loader, "LAUNCHERS", launchers)
    everything = loader.all_sources_hash()
    (launchers / "conv_v2.py").write_text((launchers / "conv_v2.py").read_text() + "\n# an edit\n")
    assert loader.all_sources_hash() != everything


def test_includes_are_followed_recursively_and_each_counted_once(sources):
    (sources / "inner.cuh").write_text("#pragma once\n")
    (sources / "outer.cuh").write_text('#pragma once\n#include "inner.cuh"\n')
    (sources / "both.cu").write_text('#include "outer.cuh"\n  #  include "inner.cuh"\n#include <cuda_bf16.h>\n')
    found = loader.included_sources(sources / "both.cu")
    assert [p.name for p in found] == ["both.cu", "outer.cuh", "inner.cuh"]
    before = loader.sources_hash("both")
    edit(sources / "inner.cuh")
    assert loader.sources_hash("both") != before


def test_the_hash_is_in_the_options_only_when_a_family_is_named():
    defines = FAMILIES["conv_v2"].DEFINES
    named = loader.compile_options(defines, "conv_v2")
    assert f"-DMINIDL_SOURCES_HASH={loader.sources_hash('conv_v2')}" in named
    assert not any("MINIDL_SOURCES_HASH" in o for o in loader.compile_options(defines))
