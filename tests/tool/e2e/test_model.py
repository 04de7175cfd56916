"""e2e.model: the tiny checkpoint's recipe; building it needs torch (in the CPU runtime), the rest does not."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tool.helpers.repos import REPO_ROOT
from vllm_overlay.e2e import model


def test_corpus_is_deterministic_text_of_the_words() -> None:
    lines = model.corpus()
    assert len(lines) == 2000 and lines == model.corpus()
    assert model.corpus(3) == lines[:3]
    assert lines[0] == " ".join(model.WORDS[(j * 13) % len(model.WORDS)] for j in range(8)) + "? 0"
    for i in (1, 2, 3, 10, 1999):
        words, end = lines[i].rsplit(" ", 1)[0], lines[i].rsplit(" ", 1)[1]
        assert end == str(i)
        assert words.endswith("?" if i % 3 == 0 else ".")
        assert len(words[:-1].split()) == 8 + i % 9
        assert set(words[:-1].split()) <= set(model.WORDS)


def test_the_shape_is_the_smallest_the_cpu_build_serves() -> None:
    assert model.HIDDEN // model.HEADS == 64  # head_dim 64: the CPU attention kernel refuses 16
    assert (model.HIDDEN, model.HEADS, model.LAYERS, model.VOCAB) == (256, 4, 2, 512)
    assert model.SPECIAL_TOKENS == ["<s>", "</s>"]


def test_the_command_line_names_its_output_without_importing_torch() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from vllm_overlay.e2e import model\n"
            "try:\n    model.main(['--help'])\nexcept SystemExit as e:\n    print('exit', e.code)\n"
            "print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=True,
    )
    assert "usage: " in done.stdout and "[-h] out\n" in done.stdout
    assert done.stdout.rstrip().endswith("exit 0\nFalse")
    assert "A tiny Llama checkpoint made on the spot" in done.stdout


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_build_without_torch_fails_before_writing_anything(tmp_path: Path) -> None:
    with pytest.raises(ModuleNotFoundError, match="torch"):
        model.build(tmp_path / "model")
    assert not (tmp_path / "model").exists()
