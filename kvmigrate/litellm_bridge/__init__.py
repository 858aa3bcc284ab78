"""kvmigrate and LiteLLM, both ways (the `litellm` extra).

- litellm as a backend of kvmigrate's proxy (`type: litellm`: Bedrock, Vertex, ...):
  `gateway` serves it on a loopback endpoint that speaks OpenAI's wire format, and `wire`
  maps OpenAI's request fields to litellm's calls and its errors back.
- kvmigrate inside LiteLLM's proxy, as a callback: `plugin` (the hooks, loaded as
  `kvmigrate.litellm_bridge.plugin.proxy_handler_instance`), `request` (what it reads of
  LiteLLM's data), `ids` and `chains` (Responses chains), `copies`, `shadow` and `routed`
  (copies through LiteLLM's router), `messages` and `answer` (answers as LiteLLM logs
  them). Its decisions are kvmigrate.policies', as the proxy's.

Not named `litellm`, which is the distribution itself. Nothing here imports litellm at
package import time: kvmigrate installs and type-checks without it; litellm is imported
when a litellm backend is configured, or by LiteLLM's proxy loading the plugin.
"""
