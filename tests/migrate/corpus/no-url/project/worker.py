# ruff: noqa
# fmt: off
from openai import OpenAI

client = OpenAI()  # relies on OPENAI_BASE_URL, else api.openai.com
