"""Adapters that put a non-OpenAI API behind an OpenAI-compatible loopback endpoint.

`litellm_gateway` serves a backend of `type: litellm`. Nothing here imports litellm at
package import time: it is imported only when a litellm backend is configured.
"""
