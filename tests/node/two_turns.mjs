// openai-node's ResponsesWS against a live hotloop server: two turns on one socket, the
// second continuing the first through previous_response_id (the connection cache).
// Usage: node two_turns.mjs <base_url ending in /v1> <api_key>
// Prints one JSON line with both response ids and the second turn's cached tokens;
// exits non-zero on any error event, unexpected close or protocol violation.
import OpenAI from 'openai';
import { ResponsesWS } from 'openai/resources/responses/ws';

const TERMINAL = new Set(['response.completed', 'response.failed', 'response.incomplete']);
const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey });
const ws = new ResponsesWS(client);
const stream = ws.stream();

async function untilTerminal() {
  for (;;) {
    const { value, done } = await stream.next();
    if (done) throw new Error('the socket closed before a terminal event');
    if (value.type === 'error') throw value.error;
    if (value.type === 'close') throw new Error(`closed: ${value.code} ${value.reason}`);
    if (value.type !== 'message') continue;
    const event = value.message;
    if (event.type === 'error') throw new Error(`error event: ${JSON.stringify(event)}`);
    if (TERMINAL.has(event.type)) return event;
  }
}

function expect(condition, message) {
  if (!condition) throw new Error(message);
}

ws.send({ type: 'response.create', model: 'sim', input: 'hello', store: false });
const first = await untilTerminal();
expect(first.type === 'response.completed', `first turn ended with ${first.type}`);

ws.send({
  type: 'response.create',
  model: 'sim',
  input: [{ type: 'message', role: 'user', content: 'and again' }],
  previous_response_id: first.response.id,
  store: false,
});
const second = await untilTerminal();
expect(second.type === 'response.completed', `second turn ended with ${second.type}`);
expect(
  second.response.previous_response_id === first.response.id,
  'the second response does not name the first as its parent',
);
ws.close({ code: 1000, reason: 'done' });
console.log(
  JSON.stringify({
    first: first.response.id,
    second: second.response.id,
    text: second.response.output.map((item) => item.content?.[0]?.text ?? '').join(''),
    cached_tokens: second.response.usage.input_tokens_details.cached_tokens,
  }),
);
