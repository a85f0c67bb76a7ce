"""A moto S3 server on loopback in a child process, for tests/test_s3.py and benchmarks/remote.py.

The server runs in its own process (its CPU and GIL are not the loader's); while the context is
open, the AWS variables point every client at it with fake credentials and no config file, and
fsspec's cached clients and feedfast's signer (:mod:`feedfast.shards.transport.s3sign`) are cleared on the
way in and out (none may point elsewhere).
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_SERVER = """
import logging, sys
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.ERROR)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()  # until the parent closes our stdin
server.stop()
"""

_CLEARED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3")


@contextmanager
def moto_s3(scratch: Path) -> Iterator[str]:
    """Start the server, point the AWS variables at it (restored after), yield its endpoint URL.

    ``scratch`` is a folder for the (absent) AWS config files.

    Raises:
        RuntimeError: the server did not start (moto missing, or it failed): its first line of output.
    """
    import s3fs

    from feedfast.shards.transport import s3sign
    proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        raise RuntimeError(f"the moto server did not start (exit {proc.wait()}); its first line: {line!r}")
    endpoint = f"http://127.0.0.1:{int(line)}"
    nowhere = str(scratch / "no-aws-config")
    settings = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
                "AWS_EC2_METADATA_DISABLED": "true",  # never ask an instance-metadata service
                "AWS_CONFIG_FILE": nowhere, "AWS_SHARED_CREDENTIALS_FILE": nowhere}
    saved = {k: os.environ.get(k) for k in (*settings, *_CLEARED)}
    os.environ.update(settings)
    for k in _CLEARED:
        os.environ.pop(k, None)
    s3fs.S3FileSystem.clear_instance_cache()
    s3sign.clear()
    try:
        yield endpoint
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        s3sign.clear()
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
