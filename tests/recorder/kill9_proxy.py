"""A proxy with the recorder, as `kvmigrate proxy` will run it, for the kill -9 test.

usage: python kill9_proxy.py CONFIG PORT"""

from __future__ import annotations

import sys

from kvmigrate.config import load_config
from kvmigrate.proxy import build_proxy_app
from kvmigrate.recorder import WriterSettings, build_recorder
from kvmigrate.serving import run_app_forever

if __name__ == "__main__":
    config = load_config(sys.argv[1])
    recorder = build_recorder(config, settings=WriterSettings(batch_size=50, flush_interval=0.1))
    app = build_proxy_app(config, addons=[recorder])
    run_app_forever(app, "127.0.0.1", int(sys.argv[2]), banner="ready")
