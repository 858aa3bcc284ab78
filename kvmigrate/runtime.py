"""The proxy as `kvmigrate proxy` runs it: forwarding plus live rollout state, auto-rollback,
the recorder and the admin API, all wired from one config."""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from kvmigrate.config import Config
from kvmigrate.continuity.link_table import LinkTable
from kvmigrate.continuity.resolver import ContinuityResolver
from kvmigrate.proxy import build_proxy_app
from kvmigrate.proxy.admin_api import add_admin_routes
from kvmigrate.recorder.evidence import open_controller
from kvmigrate.rollout.live import LiveRollout
from kvmigrate.rollout.store import RolloutStore, store_keys
from kvmigrate.rollout.watcher import RollbackWatcher
from kvmigrate.supervisor import Supervisor


def build_app(
    config: Config,
    extra_addons: Sequence[object] = (),
    record: bool = True,
    poll_interval: float = 0.25,
) -> web.Application:
    controller = open_controller(config)
    supervisor = Supervisor()
    live = LiveRollout(config, controller.store, poll_interval=poll_interval, supervisor=supervisor)
    addons: list[object] = [supervisor, live, RollbackWatcher(live, controller)]
    if record and config.record.enabled:
        from kvmigrate.recorder.addon import build_recorder

        addons.append(build_recorder(config, store_keys(controller.store)))
    if config.cachecheck.enabled:
        from kvmigrate.cachecheck.addon import CacheBusterAddon

        addons.append(
            CacheBusterAddon(
                max_conversations=config.cachecheck.max_conversations,
                ttl_s=config.cachecheck.ttl_seconds,
            )
        )
    if config.gpu.scrape:
        from kvmigrate.engine.scraper import GpuScraper

        addons.append(GpuScraper(config, supervisor))
    # Conversation links share the rollout store, so every proxy on it continues the others'.
    # The workers of `proxy --workers N` share their links in memory too (link_table).
    identity = ContinuityResolver(
        controller.store,
        config.rollout.pin_ttl_seconds,
        supervisor=supervisor,
        table=LinkTable.from_environment(),
    )
    app = build_proxy_app(config, rollout=live, addons=[*addons, *extra_addons], identity=identity)
    add_admin_routes(app, controller, config.server)
    app.on_cleanup.append(lambda _app: _close_store(controller.store))
    return app


async def _close_store(store: RolloutStore) -> None:
    store.close()
