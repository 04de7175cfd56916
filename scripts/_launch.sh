# Sourced by each command in scripts/ (which sets $here, its folder): runs one verb of the tool in
# one interpreter, the checkout's environment's (.venv, once scripts/setup installed the tool
# there), else python3. Choosing here costs a shell's start; a python3 that re-executed the
# environment's interpreter cost a second interpreter (and, behind a version manager's shim, a shell).
launch() {
  python=$here/../.venv/bin/python
  if [ ! -f "$here/../.venv/vllm-overlay-setup/pyproject.toml" ] || [ ! -x "$python" ]; then
    python=python3
    if ! command -v python3 >/dev/null 2>&1; then
      echo "${0##*/}: no python3 on PATH: the tool needs Python 3.11 or newer (then run scripts/setup)" >&2
      exit 2
    fi
  fi
  exec "$python" "$here/_entry.py" "$@"
}
