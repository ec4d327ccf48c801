// ecokv serve with the official openai client (npm "openai", not written here): a chat with an image, streaming, a
// two-turn conversation that prefills only its new tokens, per-request kv_compression, 8 concurrent clients.
//   node clients.mjs URL IMAGE
import assert from 'node:assert/strict';
import fs from 'node:fs';
import OpenAI from 'openai';

const [url, imagePath] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'not-needed', maxRetries: 0 });
const image = `data:image/png;base64,${fs.readFileSync(imagePath).toString('base64')}`;
const ask = (question, extra = {}) => ({
  model: 'tiny-vlm',
  max_tokens: 12,
  messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: image } }, { type: 'text', text: question }] }],
  ...extra,
});
const ok = (name) => console.log(`ok - ${name}`);

// The models list names the served model.
const models = await client.models.list();
assert.deepEqual(models.data.map((m) => m.id), ['tiny-vlm']);
ok('models');

// The full cache answers the sample receipt's TOTAL as the generator wrote it (models/tiny-vlm.md: 64.02).
const full = await client.chat.completions.create(ask('What is the TOTAL?', { kv_compression: false }));
assert.equal(full.choices[0].message.content, '64.02');
assert.equal(full.usage.prompt_tokens, 165);  // 144 image cells + text
ok('full cache answers 64.02');

// Compressed by default (snapkv+ecokv, 64 entries per head before the question): fewer KV bytes than the full cache.
const first = await client.chat.completions.create(ask('What is the TOTAL?'));
assert.equal(first.choices[0].finish_reason, 'stop');
assert.ok(first.usage.kv_bytes_kept < full.usage.kv_bytes_kept / 1.5, JSON.stringify([first.usage, full.usage]));
ok(`compressed answer "${first.choices[0].message.content}", ${first.usage.kv_bytes_kept} vs ${full.usage.kv_bytes_kept} KV bytes`);

// Turn 2 continues the kept conversation: only the new tokens are prefilled.
const second = await client.chat.completions.create({
  ...ask('What is the TOTAL?'),
  messages: [...ask('What is the TOTAL?').messages, first.choices[0].message, { role: 'user', content: 'What is the TAX?' }],
});
assert.ok(second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens, JSON.stringify(second.usage));
assert.ok(second.usage.prefilled_tokens < 30, JSON.stringify(second.usage));
assert.equal(second.usage.prefilled_tokens, second.usage.prompt_tokens - second.usage.prompt_tokens_details.cached_tokens);
ok(`turn 2 prefilled ${second.usage.prefilled_tokens} of ${second.usage.prompt_tokens} prompt tokens`);

// Streaming gives the same text in OpenAI's chunk format, and usage at the end.
const stream = await client.chat.completions.create(ask('What is the TOTAL?', { stream: true }));
let streamed = '';
let finish = null;
for await (const chunk of stream) {
  streamed += chunk.choices[0]?.delta?.content ?? '';
  finish = chunk.choices[0]?.finish_reason ?? finish;
}
assert.equal(streamed, first.choices[0].message.content);
assert.equal(finish, 'stop');
ok('streaming');

// Another method and budget per request: fewer entries kept, the conversation not mixed with the default's.
const small = await client.chat.completions.create(
  ask('What is the TOTAL?', { kv_compression: { method: 'pyramidkv+ecokv', budget: 32 } }));
assert.ok(small.usage.kv_bytes_kept < first.usage.kv_bytes_kept, JSON.stringify([small.usage, first.usage]));
assert.equal(small.usage.prompt_tokens_details.cached_tokens, 0);
ok('kv_compression per request');

// 8 concurrent clients: every one served, greedy answers equal to the sequential one.
const questions = ['What is the TOTAL?', 'What is the TAX?'];
const answers = await Promise.all(Array.from({ length: 8 }, (_, i) =>
  client.chat.completions.create(ask(questions[i % 2], { kv_compression: { budget: 48 } }))));
const byQuestion = {};
answers.forEach((a, i) => {
  const q = questions[i % 2];
  byQuestion[q] ??= a.choices[0].message.content;
  assert.equal(a.choices[0].message.content, byQuestion[q]);
});
ok('8 concurrent clients');

// Stop strings end the answer before them.
const stopped = await client.chat.completions.create(ask('What is the TOTAL?', { kv_compression: false, stop: ['.'] }));
assert.equal(stopped.choices[0].message.content, '64');
assert.equal(stopped.choices[0].finish_reason, 'stop');
ok('stop strings');

// Errors come back as OpenAI errors the client understands.
await assert.rejects(client.chat.completions.create({ ...ask('x'), model: 'gpt-4' }), (e) => e.status === 404);
await assert.rejects(client.chat.completions.create(ask('x', { kv_compression: { method: 'nosuch' } })),
  (e) => e.status === 400 && /nosuch/.test(e.message));
ok('errors');

// A client that goes away mid-answer: the server stops generating for it (counted in /metrics) and serves on.
const metric = async (name) => {
  const text = await (await fetch(`${url}/metrics`)).text();
  return Number(text.match(new RegExp(`^${name} (\\S+)`, 'm'))[1]);
};
const cancelledBefore = await metric('ecokv_requests_cancelled_total');
const controller = new AbortController();
const long = await client.chat.completions.create(
  ask('Read all text.', { stream: true, max_tokens: 400, kv_compression: false }), { signal: controller.signal });
try {
  for await (const chunk of long) {
    if (chunk.choices[0]?.delta?.content) {
      controller.abort();
    }
  }
} catch (e) {
  assert.ok(e.name === 'APIUserAbortError' || e.name === 'AbortError', e.name);
}
let cancelled = cancelledBefore;
for (let i = 0; i < 50 && cancelled === cancelledBefore; ++i) {
  await new Promise((r) => setTimeout(r, 100));
  cancelled = await metric('ecokv_requests_cancelled_total');
}
assert.equal(cancelled, cancelledBefore + 1);
const after = await client.chat.completions.create(ask('What is the TOTAL?', { kv_compression: false }));
assert.equal(after.choices[0].message.content, '64.02');
ok('a client going away cancels its generation');

// The client's own types for what it sends: logprobs on a chat, a text completion, usage in a stream when asked.
const lp = await client.chat.completions.create(ask('What is the TOTAL?', { kv_compression: false, logprobs: true, top_logprobs: 2 }));
assert.equal(lp.choices[0].logprobs.content.map((e) => e.token).join(''), '64.02');
assert.ok(lp.choices[0].logprobs.content.every((e) => e.top_logprobs.length === 2 && e.logprob <= 0));
const completion = await client.completions.create({ model: 'tiny-vlm', prompt: 'TOTAL', max_tokens: 4, temperature: 0 });
assert.equal(completion.object, 'text_completion');
assert.equal(typeof completion.choices[0].text, 'string');
let usage = null;
for await (const chunk of await client.chat.completions.create(ask('What is the TOTAL?', { stream: true, stream_options: { include_usage: true } }))) {
  usage = chunk.usage ?? usage;
}
assert.ok(usage && usage.completion_tokens >= 1, JSON.stringify(usage));
ok('logprobs, a text completion and stream usage through the client');
