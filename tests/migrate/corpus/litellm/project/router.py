# ruff: noqa
# fmt: off
import litellm
from litellm import acompletion


def answer(prompt: str) -> str:
    r = litellm.completion(
        model="gpt-4o-mini",
        api_base="https://api.openai.com/v1",
        messages=[{"role": "user", "content": prompt}],
    )
    return r.choices[0].message.content


async def answer_async(prompt: str) -> str:
    r = await acompletion(model="openai/gpt-4o-mini", api_base="https://api.openai.com/v1",
                          messages=[{"role": "user", "content": prompt}])
    return r.choices[0].message.content


def answer_azure(prompt: str) -> str:
    # Azure deployments are flagged, not rewritten.
    return litellm.completion(model="azure/gpt-4o", api_base="https://contoso.openai.azure.com",
                              messages=[{"role": "user", "content": prompt}])
