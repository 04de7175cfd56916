"""vLLM's entry point for the overlay's check: it imports nothing when loaded, so it always loads.

vLLM's plugin loader (vllm.plugins.load_plugins_by_group) logs "Failed to load plugin" and goes on
when a plugin's module fails to import, but an exception raised by the plugin's function ends the
process. So the check is imported here, inside ``register``: a status package that is broken,
tampered with or missing makes every vLLM process refuse to start instead of serving unchecked.
``VLLM_OVERLAY_ALLOW_MISMATCH=1`` turns the refusal into an error log (for debugging only).

What no plugin can catch: vLLM never calls a plugin that ``VLLM_PLUGINS`` leaves out, or whose
entry point (vllm_overlay_status-*.dist-info/entry_points.txt) or this file is gone. The image's
build-time verify names those (overlay files and RECORD), and ``python3 -m vllm_overlay_status
verify`` run before the server is the check that covers them.
"""

from __future__ import annotations


def register() -> None:
    try:
        from vllm_overlay_status.plugin import register as check
    except Exception as exc:
        import logging
        import os

        message = (
            f"vllm overlay: the status package cannot be imported ({type(exc).__name__}: {exc}); refusing to "
            "start a process whose files nothing checked (python3 -m vllm_overlay_status verify names the damage)"
        )
        logging.getLogger("vllm.overlay").error(message)
        if os.environ.get("VLLM_OVERLAY_ALLOW_MISMATCH") != "1":
            raise RuntimeError(message) from exc
        return
    check()
