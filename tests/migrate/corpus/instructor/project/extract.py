# ruff: noqa
# fmt: off
import instructor
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel


class User(BaseModel):
    name: str
    age: int


client = instructor.from_openai(OpenAI(base_url="https://api.openai.com/v1"))
aclient = instructor.patch(AsyncOpenAI())
