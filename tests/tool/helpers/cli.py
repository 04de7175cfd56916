"""What a verb's --help prints."""

from __future__ import annotations

import pytest

from vllm_overlay import cli


def verb_help(verb: str, capsys) -> str:
    """``--help`` of ``verb`` as the user sees it (argparse exits 0 after printing it)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main([verb, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out
