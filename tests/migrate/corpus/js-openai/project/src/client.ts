import OpenAI from "openai";

// The hosted API; kvmigrate rewrite points this at the proxy.
export const client = new OpenAI({
  baseURL: "https://api.openai.com/v1",
  apiKey: process.env.OPENAI_API_KEY,
});

const region = process.env.REGION ?? "us";
export const regional = new OpenAI({ baseURL: `https://${region}.api.openai.com/v1` });
export const fromEnv = new OpenAI(); // follows OPENAI_BASE_URL
const pattern = /["'`]baseURL/; // a regex with quotes must not confuse the scanner
