// One workload of bench/bench-vs-llama-server.sh against one server (ecokv serve or llama-server: both answer
// /v1/chat/completions and count usage.prompt_tokens_details.cached_tokens), printed as one JSON line.
//   node bench/bench-vs-llama-server.mjs URL WORKLOAD CLIENTS SECONDS PAGES_DIR
// PAGES_DIR holds images/*.png and items.jsonl (vlm/gen_pages.py --all-questions). WORKLOAD is one of:
//   one-page    every request a new conversation about the first page, a question not asked before (its fields'
//               questions, numbered)
//   unseen      every request a page not sent before (the next page, each used once: exit 1 when they run out)
//   recurring   4-turn conversations over the first 120 pages in turn (a page recurs every 120 conversations, its
//               questions rotated so that no conversation repeats another)
//   unseen-4    4-turn conversations, each about a page not sent before
//   check       each of the first 8 pages' first question once, one client: the answers, to compare the servers
// Each client sends its next request when the last is answered; a conversation started before the time is up is
// finished. Latency is per request (turn); `later_p50` is over turns 2-4.
import fs from 'node:fs';

const [url, workload, clientsArg, secondsArg, dir] = process.argv.slice(2);
const clients = Number(clientsArg), seconds = Number(secondsArg);
const items = fs.readFileSync(`${dir}/items.jsonl`, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
const pages = [];  // [{ url, questions }] in the order of items.jsonl
for (const it of items) {
  if (pages.length === 0 || pages.at(-1).file !== it.image[0]) {
    pages.push({ file: it.image[0], questions: [] });
  }
  pages.at(-1).questions.push(it.question);
}
const image = (p) => `data:image/png;base64,${fs.readFileSync(`${dir}/${p.file}`).toString('base64')}`;
const urls = new Map();  // file -> data URL, read once
const pageUrl = (p) => urls.get(p.file) ?? urls.set(p.file, image(p)).get(p.file);
const rotate = (a, k) => a.map((_, i) => a[(i + k) % a.length]);

// Conversation n of the workload: its page and questions.
const conversations = {
  'one-page': (n) => ({ page: pages[0], questions: [`${pages[0].questions[n % pages[0].questions.length]} (${n})`] }),
  unseen: (n) => ({ page: pages[n], questions: [pages[n].questions[0]] }),
  recurring: (n) => {
    const p = pages[n % Math.min(120, pages.length)];
    return { page: p, questions: rotate(p.questions, Math.floor(n / 120)).concat(p.questions).slice(0, 4) };
  },
  'unseen-4': (n) => ({ page: pages[n], questions: pages[n].questions.concat(pages[n].questions).slice(0, 4) }),
  check: (n) => ({ page: pages[n], questions: [pages[n].questions[0]] }),
};
if (!conversations[workload]) {
  console.error(`unknown workload '${workload}'`);
  process.exit(2);
}
const fresh = workload === 'unseen' || workload === 'unseen-4';
const maxTokens = Number(process.env.MAX_TOKENS ?? 12);
const limit = workload === 'check' ? Math.min(8, pages.length) : Infinity;

// Every answer is MAX_TOKENS tokens (the environment's, default 12; ignore_eos, llama-server's field, which ecokv serve
// takes too), so that both servers decode as much whatever they answer; the check takes the answers as they end.
async function ask(messages) {
  const start = performance.now();
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages, max_tokens: maxTokens, temperature: 0, ignore_eos: workload !== 'check' }),
  });
  const r = await res.json().catch(() => ({}));
  return { ok: res.ok, ms: performance.now() - start, r };
}

let next = 0, failed = 0, prompt = 0, cached = 0, completion = 0, ranOut = false;
const latencies = [], later = [], answers = [];
const end = performance.now() + seconds * 1000, t0 = performance.now();
await Promise.all(Array.from({ length: clients }, async () => {
  while (performance.now() < end && next < limit) {
    const n = next++;
    if (fresh && n >= pages.length) {
      ranOut = true;
      return;
    }
    const c = conversations[workload](n);
    const messages = [];
    for (const [turn, q] of c.questions.entries()) {
      messages.push(turn === 0 ? { role: 'user', content: [{ type: 'image_url', image_url: { url: pageUrl(c.page) } },
                                                           { type: 'text', text: q }] }
                               : { role: 'user', content: q });
      const { ok, ms, r } = await ask(messages);
      if (!ok) {
        ++failed;
        break;
      }
      latencies.push(ms);
      if (turn > 0) later.push(ms);
      prompt += r.usage.prompt_tokens;
      cached += r.usage.prompt_tokens_details?.cached_tokens ?? 0;
      completion += r.usage.completion_tokens;
      const content = r.choices[0].message.content;
      if (workload === 'check') answers.push({ page: c.page.file, question: q, answer: content, prompt_tokens: r.usage.prompt_tokens });
      messages.push({ role: 'assistant', content });
    }
  }
}));
const wall = (performance.now() - t0) / 1000;
const quantile = (a, p) => {
  const s = [...a].sort((x, y) => x - y);
  return s.length ? s[Math.min(s.length - 1, Math.floor(p * s.length))] : null;
};
console.log(JSON.stringify({
  workload, clients, seconds: wall, requests: latencies.length, rps: latencies.length / wall,
  p50: quantile(latencies, 0.5), p99: quantile(latencies, 0.99), later_p50: quantile(later, 0.5),
  prompt_tokens: prompt, cached_tokens: cached, cached_share: prompt ? cached / prompt : 0,
  completion_per_request: completion / Math.max(1, latencies.length), completion_tps: completion / wall, failed, ran_out: ranOut,
  ...(workload === 'check' ? { answers } : {}),
}));
process.exit(ranOut || failed ? 1 : 0);
