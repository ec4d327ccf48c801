// ecokv serve under load: requests/s and latency p50/p99 at 1, 4 and 8 concurrent clients (Node's fetch, each client
// sending its next request when the last is answered), each request a new conversation about the bundled receipt
// (image prefill + compression + answer); then the memory a kept conversation takes, compressed and full.
// (autocannon reported latencies that its own request counts contradict with these chunked responses: 12 requests/s
// on one connection with a 460 ms mean, so the loop below measures them itself.)
//   node bench/bench-serve.mjs URL IMAGE [SECONDS]      (bench/bench-serve.sh starts the server and runs this)
//   ROUNDS=N: every point N times; QUESTION: the question asked (default: What is the TOTAL?)
//   TURNS=N (docs/conversations.md): instead, 8 clients each holding N-turn conversations about the image, appended
//   (the default compression) against compressed again after each answer (kv_compression.recompress_slack SLACK,
//   default 32): turns/s, latency, and the memory of the kept conversations.
import fs from 'node:fs';
const [url, imagePath, seconds = '10'] = process.argv.slice(2);
const image = process.env.PAGES ? '' : `data:image/png;base64,${fs.readFileSync(imagePath).toString('base64')}`;
const body = (question, kv, page = image) => JSON.stringify({
  max_tokens: 12,
  messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: page } }, { type: 'text', text: question }] }],
  ...(kv === undefined ? {} : { kv_compression: kv }),
});
const metrics = async () => Object.fromEntries((await (await fetch(`${url}/metrics`)).text())
  .split('\n').filter((l) => l.startsWith('ecokv_')).map((l) => l.split(' ')).map(([k, v]) => [k, Number(v)]));

// `clients` loops for `seconds`, each posting `payload` (or payload(n), n counting the requests sent) and waiting for
// the whole answer.
let sent = 0;
async function load(payload, clients) {
  const latencies = [];
  let failed = 0;
  const end = performance.now() + Number(seconds) * 1000;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: clients }, async () => {
    while (performance.now() < end) {
      const start = performance.now();
      const res = await fetch(`${url}/v1/chat/completions`,
        { method: 'POST', headers: { 'content-type': 'application/json' },
          body: typeof payload === 'function' ? payload(sent++) : payload });
      await res.text();
      if (res.ok) latencies.push(performance.now() - start); else ++failed;
    }
  }));
  const wall = (performance.now() - t0) / 1000;
  latencies.sort((a, b) => a - b);
  const q = (p) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))];
  return { rps: latencies.length / wall, p50: q(0.5), p99: q(0.99), n: latencies.length, failed };
}

// `clients` loops for `seconds`, each holding conversations of `turns` turns (its questions cycled from a list, the
// first made unique so that no conversation continues another's); returns turns/s, latency and the longest head's
// entries after each conversation's last turn.
let serial = 0;  // conversations started, over every round
async function converse(kv, clients, turns) {
  const questions = ['What is the TOTAL?', 'What is the TAX?', 'Read line 1.', 'What is the DATE?'];
  const latencies = [], held = [];
  let failed = 0, conversations = 0, tokens = 0;
  const end = performance.now() + Number(seconds) * 1000;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: clients }, async () => {
    while (performance.now() < end) {
      const id = serial++;
      const messages = [];
      for (let turn = 0; turn < turns; ++turn) {
        const q = questions[turn % questions.length] + (turn === 0 ? ` (conversation ${id}, ${JSON.stringify(kv)})` : '');
        messages.push(turn === 0 ? { role: 'user', content: [{ type: 'image_url', image_url: { url: image } }, { type: 'text', text: q }] }
                                 : { role: 'user', content: q });
        const start = performance.now();
        const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ max_tokens: 12, kv_compression: kv, messages }) });
        const r = await res.json();
        if (!res.ok) { ++failed; break; }
        latencies.push(performance.now() - start);
        tokens += r.usage.completion_tokens;
        messages.push({ role: 'assistant', content: r.choices[0].message.content });
        if (turn + 1 === turns) { held.push(r.usage.kv_entries_held); ++conversations; }
      }
    }
  }));
  const wall = (performance.now() - t0) / 1000;
  latencies.sort((a, b) => a - b);
  const q = (p) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))];
  return { tps: latencies.length / wall, gen: tokens / wall, p50: q(0.5), p99: q(0.99), conversations, failed,
           held: held.reduce((a, b) => a + b, 0) / Math.max(1, held.length) };
}

// PAGES=dir (bench/bench-cores.sh): every request a page the server has not seen (the next PNG of dir, each used
// once), at 1 and 2 clients: requests/s and latency, and the server's prefix hits (0 when every page is new).
if (process.env.PAGES) {
  const dir = process.env.PAGES;
  const pages = fs.readdirSync(dir).filter((f) => f.endsWith('.png')).sort()
    .map((f) => `data:image/png;base64,${fs.readFileSync(`${dir}/${f}`).toString('base64')}`);
  const rows = [];
  for (const clients of (process.env.CLIENTS || '1,2').split(',').map(Number)) {
    const before = await metrics();
    const r = await load((n) => body('What is the TOTAL?', undefined, pages[n % pages.length]), clients);
    const after = await metrics();
    rows.push({ clients, ...r, hits: after.ecokv_cache_prefix_hits_total - before.ecokv_cache_prefix_hits_total });
  }
  console.log(JSON.stringify({ sent, pages: pages.length, rows }));
  process.exit(sent > pages.length ? 1 : 0);  // a page sent twice could hit the server's prefix entries
}

if (process.env.TURNS) {
  const turns = Number(process.env.TURNS), slack = Number(process.env.SLACK || 32);
  console.log(`| round | conversation cache | turns/s | answer tokens/s | p50 ms | p99 ms | conversations | ` +
              `entries a head after turn ${turns} | KiB kept each | failed |`);
  console.log('|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (let round = 1; round <= Number(process.env.ROUNDS || 1); ++round) {
    for (const [name, kv] of [['appended', {}], [`re-compressed (slack ${slack})`, { recompress_slack: slack }]]) {
      const before = await metrics();
      const r = await converse(kv, 8, turns);
      const after = await metrics();
      const kib = (after.ecokv_kv_cache_bytes - before.ecokv_kv_cache_bytes) /
                  Math.max(1, after.ecokv_kv_cache_conversations - before.ecokv_kv_cache_conversations) / 1024;
      console.log(`| ${round} | ${name} | ${r.tps.toFixed(1)} | ${r.gen.toFixed(0)} | ${r.p50.toFixed(0)} | ${r.p99.toFixed(0)} | ` +
                  `${r.conversations} | ${r.held.toFixed(0)} | ${kib.toFixed(1)} | ${r.failed} |`);
    }
  }
  process.exit(0);
}

// Compressed and full side by side at each client count, ROUNDS times (the machine is shared: ratios of neighbours).
const question = process.env.QUESTION || 'What is the TOTAL?';
const rows = [];
for (let round = 1; round <= Number(process.env.ROUNDS || 1); ++round) {
  for (const clients of [1, 4, 8]) {
    for (const kv of [undefined, false]) {
      rows.push({ round, cache: kv === false ? 'full' : 'compressed (default)', clients,
                  ...(await load(body(question, kv), clients)) });
    }
  }
}
console.log('| round | cache | clients | requests | requests/s | p50 ms | p99 ms | failed | compressed / full |');
console.log('|---:|---|---:|---:|---:|---:|---:|---:|---:|');
for (const [i, r] of rows.entries()) {
  const ratio = r.cache === 'full' ? (rows[i - 1].rps / r.rps).toFixed(3) : '';
  console.log(`| ${r.round} | ${r.cache} | ${r.clients} | ${r.n} | ${r.rps.toFixed(1)} | ${r.p50.toFixed(0)} | ` +
              `${r.p99.toFixed(0)} | ${r.failed} | ${ratio} |`);
}

// Memory per kept conversation: 16 conversations each way (distinct questions, so none continues another).
const per = {};
for (const kv of [undefined, false]) {
  const before = await metrics();
  for (let i = 0; i < 16; ++i) {
    await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: body(`${question} (${kv === false ? 'full' : 'compressed'} ${i})`, kv) });
  }
  const after = await metrics();
  const n = after.ecokv_kv_cache_conversations - before.ecokv_kv_cache_conversations;
  per[kv === false ? 'full' : 'compressed'] = {
    n, bytes: (after.ecokv_kv_cache_bytes - before.ecokv_kv_cache_bytes) / n,
    full: (after.ecokv_kv_cache_full_bytes - before.ecokv_kv_cache_full_bytes) / n,
  };
}
console.log('\n| kept conversation | KiB each | conversations in 1 GiB |');
console.log('|---|---:|---:|');
for (const [k, v] of Object.entries(per)) {
  console.log(`| ${k} | ${(v.bytes / 1024).toFixed(1)} | ${Math.floor(2 ** 30 / v.bytes)} |`);
}
console.log(`\n(compressed: ${(per.compressed.full / per.compressed.bytes).toFixed(2)}x fewer bytes than the same cells uncompressed)`);
