"""signed_verdicts: the cache's one verdict store, whose entries only this cache's store can have written."""

from __future__ import annotations

import json
import os
import stat

import pytest

from vllm_overlay.signed_verdicts import SignedVerdicts
from vllm_overlay.store import OutsideCacheError, Store

KEY = "ab" + "0" * 62


def _scope(name: str = "demo") -> SignedVerdicts:
    return SignedVerdicts(Store(), name, again="the demo runs again")


def test_a_saved_entry_is_found_again_signed_under_the_caches_private_secret(store_env, capsys):
    verdicts = _scope()
    where = verdicts.save_entry(KEY, {"made": "of this"}, {"ok": True})
    assert where == Store().verdicts / "demo" / "ab" / f"{KEY}.json"
    assert verdicts.load_entry(KEY) == json.loads(where.read_text())
    assert verdicts.load_entry(KEY)["result"] == {"ok": True}
    secret = Store().verdict_secret
    assert len(secret.read_bytes()) == 32 and stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert _scope("other").load_entry(KEY) is None  # scopes are apart
    assert capsys.readouterr().err == ""


def test_an_edited_entry_is_ignored_with_a_warning_that_says_what_happens_instead(store_env, capsys):
    verdicts = _scope()
    where = verdicts.save_entry(KEY, {}, {"ok": False})
    entry = json.loads(where.read_text())
    entry["result"]["ok"] = True
    where.write_text(json.dumps(entry))
    assert verdicts.load_entry(KEY) is None
    assert capsys.readouterr().err == (
        f"warning: verdict store: ignored {where}: this cache's store did not write it (its HMAC does not "
        f"match {Store().verdict_secret}); the demo runs again\n"
    )


def test_an_entry_of_another_cache_or_unreadable_is_ignored(store_env, tmp_path, monkeypatch, capsys):
    copied = _scope().save_entry(KEY, {}, {"ok": True}).read_bytes()
    monkeypatch.setenv("VLLM_OVERLAY_CACHE", str(tmp_path / "other-cache"))
    other = _scope()
    other.path(KEY).parent.mkdir(parents=True)
    other.path(KEY).write_bytes(copied)
    assert other.load_entry(KEY) is None
    assert "this cache's store did not write it" in capsys.readouterr().err
    other.path(KEY).write_text("{half")
    assert other.load_entry(KEY) is None
    assert "it cannot be read" in capsys.readouterr().err


def test_a_scope_is_a_plain_name_inside_the_verdict_store(store_env):
    with pytest.raises(OutsideCacheError):
        _scope("../envs")
