import Anthropic from "@anthropic-ai/sdk";
import AnthropicBedrock from "@anthropic-ai/bedrock-sdk";
import { createAnthropic } from "@ai-sdk/anthropic";
import { ChatAnthropic } from "@langchain/anthropic";

// Anthropic's SDK appends /v1/messages to its baseURL.
export const client = new Anthropic({
  baseURL: "http://kvmigrate:4000",
  apiKey: process.env.ANTHROPIC_API_KEY,
});
export const fromEnv = new Anthropic();
// The Vercel AI SDK's provider wants the /v1 in its baseURL.
export const vercel = createAnthropic({ baseURL: 'http://kvmigrate:4000/v1' });
export const chat = new ChatAnthropic({
  model: "claude-sonnet-4-5",
  anthropicApiUrl: `http://kvmigrate:4000`,
});
export const bedrock = new AnthropicBedrock({ awsRegion: "us-east-1" });
