# ruff: noqa
# fmt: off
import os

import autogen

config_list = [
    {
        "model": "gpt-4o",
        "base_url": "https://api.openai.com/v1",
        "api_key": os.environ["OPENAI_API_KEY"],
    },
    {
        "model": "gpt-4o",
        "api_type": "azure",
        "base_url": "https://contoso.openai.azure.com",
        "api_version": "2024-06-01",
    },
]

assistant = autogen.AssistantAgent(
    "assistant",
    llm_config={"config_list": [{"model": "gpt-4o-mini", "base_url": "https://api.openai.com/v1"}]},
)
