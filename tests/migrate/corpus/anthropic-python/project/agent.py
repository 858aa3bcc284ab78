"""A coding agent on Anthropic's SDK: the clients' base URL is the API's root."""

import os

import anthropic
from anthropic import Anthropic, AnthropicBedrock, AsyncAnthropic
from langchain_anthropic import ChatAnthropic

client = Anthropic(base_url="https://api.anthropic.com", api_key=os.environ["ANTHROPIC_API_KEY"])
aclient = AsyncAnthropic(
    base_url="https://api.anthropic.com/",  # the hosted API
    max_retries=4,
)
# Pointed at an OpenAI-style URL by hand: the SDK would call /v1/v1/messages.
wrong = anthropic.Anthropic(base_url="http://kvmigrate:4000/v1")
plain = anthropic.Anthropic()
from_env = Anthropic(base_url=os.environ.get("LLM_GATEWAY"))
bedrock = AnthropicBedrock(aws_region="us-east-1")
chat = ChatAnthropic(model="claude-sonnet-4-5", anthropic_api_url="https://api.anthropic.com")
os.environ["ANTHROPIC_BASE_URL"] = "https://api.anthropic.com"
