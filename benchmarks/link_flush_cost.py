"""What one batch of conversation links costs to write to a SQLite rollout store: on the
calling thread, through `asyncio.to_thread` (as the links' writer does), and the thread hop
alone. With `proxy --workers N` every answer waits for its batch, so the batch rate, not the
wait, is what the workers pay (docs/performance-history.md).

    python benchmarks/link_flush_cost.py [--batches 2000] [--links 17]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable

from kvmigrate.config import parse_config
from kvmigrate.continuity.resolver import _save_links
from kvmigrate.rollout.controller import initial_state
from kvmigrate.rollout.state import Link
from kvmigrate.rollout.store import RolloutStore, open_store

CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: l}}
rollout: {{state: "{url}"}}
"""


def links(count: int, batch: int) -> list[Link]:
    expires = time.time() + 3600
    return [Link(f"c:{batch}-{n}", "h:" + "ab" * 12, 2, expires) for n in range(count)]


def report(what: str, batches: int, run: Callable[[], None]) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"  {what:40} {wall / batches * 1e6:8.1f} us wall  {cpu / batches * 1e6:8.1f} us CPU")


def measure(store: RolloutStore, batches: int, size: int) -> None:
    def on_this_thread() -> None:
        for n in range(batches):
            _save_links(store, links(size, n))

    async def through_threads() -> None:
        for n in range(batches):
            await asyncio.to_thread(_save_links, store, links(size, batches + n))

    async def hops() -> None:
        for _ in range(batches):
            await asyncio.to_thread(lambda: None)

    report(f"a batch of {size}, on the calling thread", batches, on_this_thread)
    report(f"a batch of {size}, through to_thread", batches, lambda: asyncio.run(through_threads()))
    report("to_thread of nothing", batches, lambda: asyncio.run(hops()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--links", type=int, default=17, help="links per batch")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/state.db"
        store = open_store(url, initial_state(parse_config(CONFIG.format(url=url), env={})))
        try:
            measure(store, args.batches, args.links)
        finally:
            store.close()


if __name__ == "__main__":
    main()
