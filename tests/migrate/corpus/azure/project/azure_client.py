# ruff: noqa
# fmt: off
import os

from openai import AzureOpenAI

client = AzureOpenAI(
    azure_endpoint="https://contoso.openai.azure.com",
    api_version="2024-06-01",
    api_key=os.environ["AZURE_OPENAI_API_KEY"],
)
