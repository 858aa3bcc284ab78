# ruff: noqa
# fmt: off
import boto3

runtime = boto3.client("bedrock-runtime", region_name="us-east-1")
s3 = boto3.client("s3")  # not an LLM client: no finding
