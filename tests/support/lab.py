"""Shared constants of the browser suite (a module, not conftest: conftest names collide across test dirs)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

KERNEL_IDLE_JS = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const s = w && w.sessionContext;
  return !!(s && s.isReady && s.session && s.session.kernel
            && s.session.kernel.connectionStatus === 'connected'
            && s.session.kernel.status === 'idle');
}"""
