"""The build context's data: a layer's bytes, the context's Dockerfile, series sha256 and staged size."""

from __future__ import annotations

from tests.tool.helpers.images import bare_build_context
from vllm_overlay.image.model import SeriesLayer, ShippedFile


def test_a_layer_weighs_the_files_it_ships():
    files = [ShippedFile("vllm/a.py", "0" * 64, 10, "modified"), ShippedFile("vllm/b.py", "1" * 64, 32, "added")]
    assert SeriesLayer("alpha", "01-alpha", files=files).bytes == 42
    assert SeriesLayer("beta", "02-beta").bytes == 0


def test_a_shipped_files_json_leaves_its_mode_to_the_layer():
    shipped = ShippedFile("vllm/run.sh", "2" * 64, 5, "added", executable=True)
    assert shipped.to_json() == {"path": "vllm/run.sh", "sha256": "2" * 64, "size": 5, "change": "added"}


def test_the_context_names_its_dockerfile_series_and_the_bytes_it_holds(tmp_path):
    (tmp_path / "layers" / "01-alpha").mkdir(parents=True)
    (tmp_path / "layers" / "01-alpha" / "a.py").write_bytes(b"x" * 7)
    (tmp_path / "Dockerfile").write_bytes(b"FROM scratch\n")
    context = bare_build_context(tmp_path)
    assert context.dockerfile == tmp_path / "Dockerfile"
    assert context.series_sha256 == "ab" * 32
    assert context.staged_bytes == 7 + len(b"FROM scratch\n")
