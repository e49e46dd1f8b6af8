// The Vercel AI SDK (`ai`, `@ai-sdk/openai`, `@ai-sdk/anthropic`) against a running agentd,
// with each provider's defaults: `openai('agentd')` speaks the Responses API. Run by
// tests/it/clients.rs, copied next to the SDK's node_modules (scripts/install-test-peers.sh
// `clients`). Environment: AGENTD_BASE, AGENTD_TOKEN. Prints one JSON object per step.
import { generateText, streamText, tool, stepCountIs } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createAnthropic } from '@ai-sdk/anthropic';
import { z } from 'zod';

const BASE = process.env.AGENTD_BASE;
const TOKEN = process.env.AGENTD_TOKEN;
const out = (step, fields) => console.log(JSON.stringify({ step, ...fields }));

const openai = createOpenAI({ baseURL: `${BASE}/v1`, apiKey: TOKEN });
const anthropic = createAnthropic({ baseURL: `${BASE}/v1`, apiKey: TOKEN });
const weather = tool({
  description: 'The weather of a city',
  inputSchema: z.object({ city: z.string() }),
  execute: async ({ city }) => `18 C and sunny in ${city}`,
});

const r = await generateText({ model: openai('agentd'), prompt: 'clients hello ai sdk' });
out('openai', { text: r.text, finish: r.finishReason, input: r.usage.inputTokens, id: r.response.id });

const s = streamText({ model: openai('agentd'), prompt: 'clients stream ai sdk' });
let streamed = '';
for await (const piece of s.textStream) streamed += piece;
out('openai_stream', { text: streamed, finish: await s.finishReason });

const t = await generateText({
  model: openai('agentd'),
  prompt: 'clients weather aisdk',
  tools: { get_weather: weather },
  stopWhen: stepCountIs(3),
});
out('openai_tools', { text: t.text, steps: t.steps.length });

const a = await generateText({ model: anthropic('agentd'), prompt: 'clients hello anthropic' });
out('anthropic', { text: a.text, finish: a.finishReason });

const at = await generateText({
  model: anthropic('agentd'),
  prompt: 'clients weather aisdkant',
  tools: { get_weather: weather },
  stopWhen: stepCountIs(3),
});
out('anthropic_tools', { text: at.text, steps: at.steps.length });
