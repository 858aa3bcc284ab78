# ruff: noqa
# fmt: off
from crewai import LLM, Agent

llm = LLM(model="gpt-4o", base_url="https://api.openai.com/v1", temperature=0.2)
researcher = Agent(role="Researcher", goal="Find facts", backstory="Curious", llm=llm)
