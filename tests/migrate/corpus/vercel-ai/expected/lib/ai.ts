import { createOpenAI } from '@ai-sdk/openai';
import { generateText } from 'ai';

const openai = createOpenAI({
  baseURL: 'http://kvmigrate:4000/v1',
  compatibility: 'strict',
});

export async function summarize(text: string) {
  return generateText({ model: openai('gpt-4o-mini'), prompt: `Summarize: ${text}` });
}
