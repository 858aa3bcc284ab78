# ruff: noqa
# fmt: off
import dspy

lm = dspy.LM("openai/gpt-4o-mini", api_base="http://kvmigrate:4000/v1", max_tokens=512)
dspy.configure(lm=lm)
qa = dspy.Predict("question -> answer")
