# ruff: noqa
# fmt: off
"""Module-level configuration, v1 style and the pre-1.0 name."""
import openai
import openai as oa

openai.base_url = "http://kvmigrate:4000/v1"
oa.api_base = 'http://kvmigrate:4000/v1'  # legacy v0 name
openai.api_key = "sk-not-touched-without-proxy-key"
