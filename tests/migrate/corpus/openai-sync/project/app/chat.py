# ruff: noqa
# fmt: off
"""A small chat service that talks to the hosted API."""
import os

from openai import OpenAI

# Hosted endpoint; the migration moves this behind kvmigrate.
client = OpenAI(
    base_url="https://api.openai.com/v1",  # keep the trailing comment
    api_key=os.environ["OPENAI_API_KEY"],
    timeout=30,
)


def ask(question: str) -> str:
    reply = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": question}],
    )
    return reply.choices[0].message.content or ""
