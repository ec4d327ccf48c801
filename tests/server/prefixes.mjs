// Compress once, ask many, through ecokv serve (docs/serve.md, "Prefix entries"): a page's compressed context is kept
// as an entry of its own, which any new conversation about the page resumes, prefilling only its question.
//   node prefixes.mjs URL FRESH_URL SMALL_URL PAGES_DIR
// URL: the server under test; FRESH_URL: the same server options with --cache-mib 0 (nothing kept: every answer from
// a fresh prefill with the same compression); SMALL_URL: a 1 MiB cache. PAGES_DIR: page-0.png ... page-12.png, the
// same receipt with one pixel changed (a different image hash each).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import OpenAI from 'openai';

const [url, freshUrl, smallUrl, pages] = process.argv.slice(2);
const ok = (what) => console.log(`ok - ${what}`);
const page = (i) => `data:image/png;base64,${fs.readFileSync(`${pages}/page-${i}.png`).toString('base64')}`;
const ask = async (base, i, question, kv) => {
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'not-needed', maxRetries: 0 });
  const r = await client.chat.completions.create({
    max_tokens: 12, temperature: 0, ...(kv === undefined ? {} : { kv_compression: kv }),
    messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: page(i) } }, { type: 'text', text: question }] }],
  });
  return { text: r.choices[0].message.content, prompt: r.usage.prompt_tokens,
           cached: r.usage.prompt_tokens_details.cached_tokens, prefilled: r.usage.prefilled_tokens };
};
const metric = async (base, name) => {
  const text = await (await fetch(`${base}/metrics`)).text();
  return Number(text.match(new RegExp(`^ecokv_${name} (\\S+)`, 'm'))[1]);
};

// Four questions about one page in four new conversations: one prefill, then three hits on the kept context, each
// prefilling only its question; every answer the fresh prefill's with the same compression.
const questions = ['What is the TOTAL?', 'What is the TAX?', 'What is the DATE?', 'Read the first line.'];
const before = { prefix: await metric(url, 'cache_prefix_hits_total'), miss: await metric(url, 'cache_misses_total') };
const first = [];
for (const q of questions) {
  first.push(await ask(url, 0, q));
}
assert.equal(await metric(url, 'cache_prefix_hits_total') - before.prefix, 3);
assert.equal(await metric(url, 'cache_misses_total') - before.miss, 1);
assert.equal(first[0].cached, 0);
for (const a of first.slice(1)) {
  assert.ok(a.cached > 0 && a.prefilled < 40 && a.cached + a.prefilled === a.prompt, JSON.stringify(a));
}
for (const [k, q] of questions.entries()) {
  const fresh = await ask(freshUrl, 0, q);
  assert.equal(fresh.cached, 0);
  assert.equal(first[k].text, fresh.text, q);
}
const slots = await (await fetch(`${url}/slots`)).json();
assert.ok(slots.some((s) => s.cache_hit === 'prefix'), JSON.stringify(slots));
ok(`four questions about one page: 1 prefill, 3 prefix hits (${first[1].prefilled} of ${first[1].prompt} tokens prefilled), answers as fresh prefills`);

// The same request again: its prompt is a prefix of the kept conversation (the prompt and the answer's tokens), so the
// longest kept prefix of it, the page's context, is resumed and only the question prefilled; the same answer. With
// one answer token (picked, never decoded) the kept conversation is the prompt itself: resumed whole, nothing
// prefilled, its snapshot's logits giving the same token.
const again = await ask(url, 0, questions[0]);
assert.equal(again.cached, first[1].cached);
assert.equal(again.text, first[0].text);
const one = async () => {
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'not-needed', maxRetries: 0 });
  const r = await client.completions.create({ prompt: 'Once upon a time', max_tokens: 1, temperature: 0 });
  return { text: r.choices[0].text, cached: r.usage.prompt_tokens_details.cached_tokens, prompt: r.usage.prompt_tokens };
};
const once = await one();
const twice = await one();
assert.equal(twice.cached, twice.prompt);
assert.equal(twice.text, once.text);
ok(`an identical request: the page's context resumed (${again.cached} of ${again.prompt} tokens); a prompt kept whole resumed with nothing to prefill`);

// Other compression options: their own prefill (no cross-hit), then their own context reused.
const other = await ask(url, 0, questions[1], { budget: 48 });
assert.equal(other.cached, 0);
const otherAgain = await ask(url, 0, questions[2], { budget: 48 });
assert.ok(otherAgain.cached > 0, JSON.stringify(otherAgain));
assert.equal(otherAgain.text, (await ask(freshUrl, 0, questions[2], { budget: 48 })).text);
const full = await ask(url, 0, questions[1], false);
assert.equal(full.cached, 0);
const fullAgain = await ask(url, 0, questions[2], false);
assert.ok(fullAgain.cached > 0);
assert.equal(fullAgain.text, (await ask(freshUrl, 0, questions[2], false)).text);
ok('other compression options and the full cache: no cross-hit, each reuses its own context exactly');

// A small cache: the page's context evicted by twelve other pages is a miss again, answered right.
const kept = await ask(smallUrl, 0, questions[0]);
for (let i = 1; i <= 12; ++i) {
  await ask(smallUrl, i, questions[0]);
}
assert.ok(await metric(smallUrl, 'kv_cache_evictions_total') > 0);
const missesBefore = await metric(smallUrl, 'cache_misses_total');
const evicted = await ask(smallUrl, 0, questions[1]);
assert.equal(evicted.cached, 0);
assert.equal(await metric(smallUrl, 'cache_misses_total') - missesBefore, 1);
assert.equal(evicted.text, first[1].text);
assert.equal(kept.text, first[0].text);
ok('a context evicted from a 1 MiB cache is a miss, answered as before');

// Eight concurrent new conversations about one new page: all answered as fresh prefills (under TSan: no race on the
// entry they share).
const answers = await Promise.all(questions.concat(questions).map((q) => ask(url, 12, q)));
const fresh12 = [];
for (const q of questions) {
  fresh12.push((await ask(freshUrl, 12, q)).text);
}
for (const [k, a] of answers.entries()) {
  assert.equal(a.text, fresh12[k % 4], questions[k % 4]);
}
ok('eight concurrent conversations about one page');
