import { createOpenAI } from '@ai-sdk/openai';
import { generateText } from 'ai';

const openai = createOpenAI({
  baseURL: 'https://api.openai.com/v1',
  compatibility: 'strict',
});

export async function summarize(text: string) {
  return generateText({ model: openai('gpt-4o-mini'), prompt: `Summarize: ${text}` });
}
