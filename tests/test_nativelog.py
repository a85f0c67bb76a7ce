"""nativelog: native lines written to fd 2 go to logging while captured; everything else reaches stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import importlib.util, json, logging, os, sys
spec = importlib.util.spec_from_file_location("nativelog", {path!r})  # not the package: no torch to import
nativelog = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nativelog)
said = []
class Keep(logging.Handler):
    def emit(self, record):
        said.append((record.name, record.levelname, record.getMessage()))
logging.getLogger("feedfast").addHandler(Keep())
logging.getLogger("feedfast").setLevel(logging.INFO)
first, second = nativelog.Capture(), nativelog.Capture()
os.write(2, b"\x1b[0;31m[ERROR] \x1b[0m[libtiff_decoder] Unsupported photometric interpretation: 5\n")
os.write(2, b"libpng error: IDAT: CRC error\n")
print("a traceback line of the user's own", file=sys.stderr, flush=True)
os.write(2, b"[progress 50%]")  # a partial line that may start a native one: passed on after a moment
first.release()
first.release()  # idempotent: the second holder keeps the capture
os.write(2, b"\n[ERROR] [jpeg_parser] Invalid marker\n")
second.release()
import time; time.sleep(0.5)  # the relay's last lines reach the logger
os.write(2, b"[ERROR] [after] printed: nothing captures fd 2 any more\n")
print(json.dumps(said))
"""


def test_native_lines_go_to_logging_and_the_rest_to_stderr() -> None:
    path = str(Path(__file__).resolve().parents[1] / "feedfast" / "loader" / "backends" / "dali" / "nativelog.py")
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(path=path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout)
    assert [(name, level) for name, level, _ in said] == [("feedfast.dali", "INFO")] * 3
    assert [text for _, _, text in said] == [
        "[ERROR] [libtiff_decoder] Unsupported photometric interpretation: 5", "libpng error: IDAT: CRC error",
        "[ERROR] [jpeg_parser] Invalid marker"]
    assert proc.stderr.splitlines() == ["a traceback line of the user's own", "[progress 50%]",
                                        "[ERROR] [after] printed: nothing captures fd 2 any more"]


CRASH = r"""
import importlib.util, os
spec = importlib.util.spec_from_file_location("nativelog", {path!r})
nativelog = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nativelog)
nativelog.Capture()
os.write(2, b"Fatal Python error: Segmentation fault (the last words)\n")
os._exit(139)  # dies at once: no release, no flush, no atexit
"""


def test_what_a_crashing_process_writes_last_still_reaches_stderr() -> None:
    """The relay is a process of its own: it passes on what is left in the pipe after its parent died."""
    path = str(Path(__file__).resolve().parents[1] / "feedfast" / "loader" / "backends" / "dali" / "nativelog.py")
    proc = subprocess.run([sys.executable, "-c", CRASH.format(path=path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 139
    assert proc.stderr == "Fatal Python error: Segmentation fault (the last words)\n"
