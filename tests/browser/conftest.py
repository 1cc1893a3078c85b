"""Browser fixtures: one throw-away JupyterLab server per test session, Debian's Chromium through Playwright.

Adapted from ../shared/recipes/jupyterlab-browser: a free loopback port, empty token, isolated config/runtime/
settings dirs, ``window.jupyterapp`` exposed for kernel-state waits, no news toast; teardown deletes the kernels
through the API, then SIGTERMs the server. Notebooks are generated per test into the server's root (a tmp dir).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.lab import ROOT

ARTIFACTS = Path(os.environ.get("TROPT_BROWSER_ARTIFACTS", Path(__file__).parent / "artifacts"))
SERVER_START_TIMEOUT = 90
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(url: str, method: str = "GET", timeout: float = 5):
    req = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
        return json.loads(body) if body else None


@pytest.fixture(scope="session")
def jupyter_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("jlab")
    root, home = base / "root", base / "home"
    root.mkdir()
    home.mkdir()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ,
           "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "IPYTHONDIR": str(home / "ipython"), "JUPYTER_PLATFORM_DIRS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
           "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1",
           "--ServerApp.token=", "--ServerApp.password=", f"--ServerApp.root_dir={root}",
           "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           f"--LabApp.workspaces_dir={home / 'workspaces'}", f"--LabApp.user_settings_dir={home / 'settings'}"]
    notif = home / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notif.parent.mkdir(parents=True)
    notif.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    with open(base / "server.log", "w") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"jupyter lab exited rc={proc.returncode}:\n"
                                       + (base / "server.log").read_text()[-3000:])
                try:
                    _api(f"{url}/api/status", timeout=2)
                    break
                except OSError as err:
                    if time.monotonic() - t0 > SERVER_START_TIMEOUT:
                        raise TimeoutError("jupyter lab did not start:\n"
                                           + (base / "server.log").read_text()[-3000:]) from err
                    time.sleep(0.25)
            yield {"url": url, "root": root, "log": base / "server.log"}
        finally:
            try:
                for k in _api(f"{url}/api/kernels") or []:
                    _api(f"{url}/api/kernels/{k['id']}", method="DELETE", timeout=15)
            except Exception:  # noqa: BLE001 -- best-effort kernel cleanup must never stop the server's shutdown
                pass
            proc.send_signal(signal.SIGTERM)  # SIGINT would wait for a y/n confirmation
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def page(chromium):
    context = chromium.new_context(viewport={"width": 1300, "height": 1600})
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    yield pg
    context.close()


@pytest.fixture
def notebook(jupyter_server, request):
    """``notebook(*sources)`` writes a notebook of those code cells into the server root and returns its name."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    def make(*sources: str) -> str:
        name = request.node.name.replace("[", "_").replace("]", "") + ".ipynb"
        nb = new_notebook(cells=[new_code_cell(s) for s in sources], metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}})
        nbformat.write(nb, jupyter_server["root"] / name)
        return name

    return make


@pytest.fixture
def artifacts():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
