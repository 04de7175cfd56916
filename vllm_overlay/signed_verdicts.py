"""The cache's verdict store: entries kept under a key, signed with the cache's secret, written under its lock.

Both suites that keep verdicts use it: test-patches (vllm_overlay.testrun.verdict_store, one scope
per test environment and runner version) and serve-e2e (vllm_overlay.e2e.verdict, scope ``e2e``).
Each computes its own key from what decides its verdict; this module only keeps and reads entries.

An entry is ``verdicts/<scope>/<key[:2]>/<key>.json``: ``{"key", "what", "result", "mac"}``, where
``what`` says what the key was made of and ``mac`` is an HMAC-SHA256 of key, what and result made
with the cache's own secret (``verdicts/.secret``, made on first use, readable by its owner only).
A file under another key's name, or one the store did not write (copied in, edited, forged), is
ignored with a warning that says which, and the suite runs again. Writes are atomic (a reader
never sees half an entry) and taken under the cache's lock.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

from vllm_overlay import atomicfile, output
from vllm_overlay.store import Store


class SignedVerdicts:
    """One scope of the verdict store; ``again`` ends each warning: what happens instead of the kept verdict."""

    def __init__(self, store: Store, scope: str, again: str) -> None:
        self.store = store
        self.root = store.verdict_scope(scope)
        self.again = again

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def _secret(self) -> bytes:
        """The cache's own key for signing entries (made under the store's lock on first use)."""
        path = self.store.verdict_secret
        try:
            return path.read_bytes()
        except FileNotFoundError:
            pass
        with self.store.exclusive():
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = atomicfile.create_temp(path.parent, f"{path.name}.", ".tmp")
                try:
                    os.fchmod(fd, 0o600)
                    os.write(fd, os.urandom(32))
                    os.close(fd)
                    os.replace(tmp, path)
                finally:
                    tmp.unlink(missing_ok=True)
        return path.read_bytes()

    def _mac(self, key: str, what: object, result: object) -> str:
        body = json.dumps([key, what, result], sort_keys=True).encode()
        return hmac.new(self._secret(), body, hashlib.sha256).hexdigest()

    def warn(self, path: Path, why: str) -> None:
        """Say that the entry at ``path`` is not used, why, and what happens instead."""
        output.warn(f"verdict store: ignored {path}: {why}; {self.again}")

    def load_entry(self, key: str) -> dict[str, Any] | None:
        """The signed entry for ``key`` (``what`` and ``result``), or None: absent, or refused with a warning."""
        path = self.path(key)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self.warn(path, f"it cannot be read ({exc})")
            return None
        if not isinstance(data, dict) or data.get("key") != key:
            answers = data.get("key") if isinstance(data, dict) else None
            self.warn(path, f"it answers key {answers!r}, not {key} its name gives")
            return None
        if not hmac.compare_digest(str(data.get("mac", "")), self._mac(key, data.get("what"), data.get("result"))):
            self.warn(
                path, f"this cache's store did not write it (its HMAC does not match {self.store.verdict_secret})"
            )
            return None
        return data

    def save_entry(self, key: str, what: object, result: object) -> Path:
        """Keep ``result`` under ``key``, signed, with ``what`` the key was made of."""
        path = self.path(key)
        data = {"key": key, "what": what, "result": result, "mac": self._mac(key, what, result)}
        with self.store.exclusive():
            path.parent.mkdir(parents=True, exist_ok=True)
            atomicfile.write_bytes(path, json.dumps(data, indent=1, sort_keys=True).encode("utf-8"))
        return path
