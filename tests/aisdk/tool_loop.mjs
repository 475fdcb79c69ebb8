// The Vercel AI SDK against a live hotloop server over HTTP: generateText and streamText,
// each with a tool the model calls once before it answers (two steps: the call, its
// result sent back, the answer). Prints one JSON line with what the SDK saw.
// Usage: node tool_loop.mjs BASE_URL API_KEY
import { createOpenResponses } from "@ai-sdk/open-responses";
import { generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const [baseUrl, apiKey] = process.argv.slice(2);
const provider = createOpenResponses({
  name: "hotloop",
  url: `${baseUrl}/responses`,
  apiKey,
});
const model = provider("sim");

const calls = [];
const weather = tool({
  description: "Get the current weather for a location",
  inputSchema: z.object({ location: z.string() }),
  execute: async ({ location }) => {
    calls.push(location);
    return { location, forecast: "sunny" };
  },
});

const generated = await generateText({
  model,
  prompt: "What is the weather in Paris?",
  tools: { get_weather: weather },
  stopWhen: stepCountIs(3),
});

const streamed = streamText({
  model,
  prompt: "What is the weather in Oslo?",
  tools: { get_weather: weather },
  stopWhen: stepCountIs(3),
});
let deltas = 0;
for await (const part of streamed.fullStream) {
  if (part.type === "text-delta") deltas += 1;
  if (part.type === "error") throw part.error;
}

console.log(
  JSON.stringify({
    generated: {
      text: generated.text,
      steps: generated.steps.length,
      finishReason: generated.finishReason,
      toolCalls: generated.steps.flatMap((s) => s.toolCalls.map((c) => c.toolName)),
      inputTokens: generated.totalUsage.inputTokens,
    },
    streamed: {
      text: await streamed.text,
      steps: (await streamed.steps).length,
      finishReason: await streamed.finishReason,
      deltas,
    },
    calls,
  }),
);
