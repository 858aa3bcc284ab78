# ruff: noqa
# fmt: off
"""An async agent loop; this file uses CRLF line endings on purpose."""
import asyncio

import openai


async def main() -> None:
    client = openai.AsyncOpenAI(base_url='http://kvmigrate:4000/v1')
    # a second client that is already pointed at the proxy stays as it is
    proxied = openai.AsyncOpenAI(base_url="http://kvmigrate:4000/v1")
    for c in (client, proxied):
        await c.models.list()


asyncio.run(main())
