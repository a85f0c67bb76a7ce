"""A torch loop that ends abruptly, for tests/test_cli_watch.py (run unchanged under watch).

``--end os_exit``: ``os._exit(0)`` after ``--steps`` steps (as scripts do to skip a slow DataLoader
teardown). ``--end sigterm`` / ``--end sigkill``: after ``--steps`` steps it asks ``kill`` (another
process) for that signal and loops on until it arrives. ``--own-handler FILE``: a SIGTERM handler of
the job's own, installed first, writes FILE and exits with status 3. Each step costs ``--compute-ms``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--end", choices=["os_exit", "sigterm", "sigkill"], required=True)
    p.add_argument("--compute-ms", type=float, default=10.0)
    p.add_argument("--own-handler", default=None)
    args = p.parse_args()
    if args.own_handler:
        import signal

        def own(signum: int, frame: object) -> None:
            with open(args.own_handler, "w") as f:
                f.write("job's handler ran\n")
            sys.exit(3)

        signal.signal(signal.SIGTERM, own)
    loader = DataLoader(TensorDataset(torch.arange(100_000)), batch_size=4)
    for step, _ in enumerate(loader, 1):
        time.sleep(args.compute_ms / 1e3)
        if step == args.steps:
            print(f"job: {step} steps", flush=True)
            if args.end == "os_exit":
                os._exit(0)
            signal_name = "-TERM" if args.end == "sigterm" else "-KILL"
            subprocess.Popen(["kill", signal_name, str(os.getpid())])
    return 0


if __name__ == "__main__":
    sys.exit(main())
