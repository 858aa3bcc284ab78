# ruff: noqa
# fmt: off
from llama_index.llms.openai import OpenAI
from llama_index.llms.openai_like import OpenAILike

llm = OpenAI(model="gpt-4o-mini", api_base="https://api.openai.com/v1")
local = OpenAILike(
    model="meta-llama/Llama-3.1-8B-Instruct",
    api_base="http://vllm.internal:8000/v1",
    is_chat_model=True,
)
