# ruff: noqa
# fmt: off
import os

from openai import OpenAI

HOST = os.environ.get("LLM_HOST", "api.openai.com")
BASE = "https://" + HOST + "/v1"

a = OpenAI(base_url=f"https://{HOST}/v1")
b = OpenAI(base_url="https://" + HOST + "/v1")
c = OpenAI(base_url=BASE)
d = OpenAI(base_url=os.getenv("OPENAI_BASE_URL"))
