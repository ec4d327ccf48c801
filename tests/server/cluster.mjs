// Several replicas, one memory: ecokv serve replicas behind HAProxy sharing kept conversations through Redis
// (deploy/cluster.sh). Asserts what docs/serve.md ("Several servers") promises:
//  A. 8 conversations of 5 turns, every turn on another replica than the turn before: each answer equals one
//     server's (REF, the same requests), and every turn after the first resumes from the store (cached tokens > 0,
//     the replicas' store hits count them all);
//     two replicas writing one conversation's entries at once leave an entry that a third resumes;
//  B. a replica killed with SIGKILL between turns: the conversations go on elsewhere, from the store;
//  C. a live entry flipped, cut short, or replaced by another model's entry (redis-cli): refused, counted by fault,
//     and the turn answered as a full prefill answers it (FRESH, a server keeping nothing);
//  D. Redis stopped: every request still served (each replica's own cache), a replica started meanwhile serves too;
//     Redis back: every replica connects again within seconds, without requests (counted), and conversations
//     resume across replicas again.
//   node cluster.mjs CLUSTER_URL REF_URL FRESH_URL FOREIGN_URL REDIS_PORT CLUSTER_DIR PAGES_DIR ROOT
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';

const [clusterUrl, refUrl, freshUrl, foreignUrl, redisPort, clusterDir, pagesDir, root] = process.argv.slice(2);
const questions = ['What is the TOTAL?', 'What is the TAX?', 'What is the DATE?', 'What is the SUBTOTAL?',
  'Read the first line.'];
const t0 = Date.now();
const log = (what) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] ${what}`);

const redis = (...args) => execFileSync('redis-cli', ['-p', redisPort, ...args], { encoding: 'utf8' }).trim();
const cluster = (...args) => execFileSync('bash', [`${root}/deploy/cluster.sh`, ...args, '--dir', clusterDir],
  { encoding: 'utf8' });
const page = (i) => `data:image/png;base64,${fs.readFileSync(`${pagesDir}/page-${i}.png`).toString('base64')}`;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function ask(url, messages) {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages, max_tokens: 12, temperature: 0 }),
  });
  const body = await res.json();
  assert.equal(res.status, 200, `HTTP ${res.status}: ${JSON.stringify(body)}`);
  return { text: body.choices[0].message.content, cached: body.usage.prompt_tokens_details.cached_tokens,
    replica: res.headers.get('x-ecokv-replica') };
}

// The replicas' own /metrics (not through HAProxy): the sum of a sample over the live ones.
const alive = (pidFile) => {  // running and not a zombie (a killed replica is nobody's child to reap here)
  try {
    const stat = fs.readFileSync(`/proc/${fs.readFileSync(pidFile, 'utf8').trim()}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch { return false; }
};
const replicaNames = () => fs.readdirSync(clusterDir).filter((f) => /^r\d+\.pid$/.test(f) && alive(`${clusterDir}/${f}`))
  .map((f) => f.slice(0, -4));
async function metric(sample) {
  let sum = 0;
  for (const name of replicaNames()) {
    const res = await fetch(`http://127.0.0.1:${fs.readFileSync(`${clusterDir}/${name}.port`, 'utf8').trim()}/metrics`);
    const line = (await res.text()).split('\n').find((l) => l.startsWith(`ecokv_${sample} `));
    assert.ok(line, `${name} has no ${sample}`);
    sum += Number(line.split(' ')[1]);
  }
  return sum;
}
async function written() {  // every replica's queued writes done
  for (let i = 0; i < 100 && await metric('store_writes_queued') > 0; ++i) await sleep(50);
  assert.equal(await metric('store_writes_queued'), 0, 'writes still queued after 5 s');
}

class Conversation {
  constructor(pageIndex) { this.image = page(pageIndex); this.messages = []; this.turns = []; this.name = `page ${pageIndex}`; }
  say(question) {
    this.messages.push(this.messages.length === 0
      ? { role: 'user', content: [{ type: 'image_url', image_url: { url: this.image } }, { type: 'text', text: question }] }
      : { role: 'user', content: question });
  }
  // The next turn on the cluster, checked against `reference` (one server's answer to the same request).
  async turn(question, reference = refUrl, target = clusterUrl) {
    this.say(question);
    const got = await ask(target, this.messages);
    const want = await ask(reference, this.messages);
    const n = this.turns.length + 1;
    assert.equal(got.text, want.text, `${this.name}, turn ${n} on ${got.replica}: '${got.text}', one server '${want.text}'`);
    this.messages.push({ role: 'assistant', content: got.text });
    this.turns.push(got);
    return got;
  }
}

// A. Every turn on another replica than the one before, each resumed from the store.
const hitsBefore = await metric('store_hits_total');
const convs = Array.from({ length: 8 }, (_, i) => new Conversation(i));
for (let t = 0; t < 5; ++t) {
  for (const c of convs) {  // lockstep, one request at a time: round robin over 3 replicas moves every conversation
    const got = await c.turn(questions[t]);
    if (t > 0) {
      assert.notEqual(got.replica, c.turns[t - 1].replica, `${c.name}, turn ${t + 1}: the same replica again`);
      assert.ok(got.cached > 0, `${c.name}, turn ${t + 1} on ${got.replica}: nothing cached`);
    }
  }
}
const storeHits = await metric('store_hits_total') - hitsBefore;
assert.ok(storeHits >= 8 * 4, `${storeHits} store hits for 32 turns that each moved to another replica`);
log(`A: 8 conversations x 5 turns across 3 replicas, answers as one server's, ${storeHits} store hits`);

// Two replicas answering the same turn at once both write its entries (one SET each, whole): the next turn, on the
// third replica, resumes one of them.
{
  const twin = new Conversation(17);
  twin.say(questions[0]);
  const [a, b] = await Promise.all([ask(clusterUrl, twin.messages), ask(clusterUrl, twin.messages)]);
  const want = await ask(refUrl, twin.messages);
  assert.notEqual(a.replica, b.replica, 'both requests went to one replica');
  assert.equal(a.text, want.text);
  assert.equal(b.text, want.text);
  twin.messages.push({ role: 'assistant', content: a.text });
  twin.turns.push(a);
  await written();
  const got = await twin.turn(questions[1]);
  assert.ok(![a.replica, b.replica].includes(got.replica) && got.cached > 0, 'the third replica did not resume it');
  log(`A: ${a.replica} and ${b.replica} wrote one conversation at once; ${got.replica} resumed it`);
}

// B. SIGKILL a replica between turns.
const survivors = Array.from({ length: 4 }, (_, i) => new Conversation(8 + i));
for (let t = 0; t < 2; ++t) for (const c of survivors) await c.turn(questions[t]);
await written();
const victim = survivors.at(-1).turns.at(-1).replica;
process.kill(Number(fs.readFileSync(`${clusterDir}/${victim}.pid`, 'utf8')), 'SIGKILL');
for (let t = 2; t < 5; ++t) {
  for (const c of survivors) {
    const got = await c.turn(questions[t]);
    assert.notEqual(got.replica, victim);
    assert.ok(got.cached > 0, `${c.name}, turn ${t + 1} after ${victim} was killed: nothing cached`);
  }
}
log(`B: ${victim} killed (SIGKILL) after turn 2 of 4 conversations: every turn after it resumed elsewhere`);

// C. A live entry damaged in Redis: refused before any byte reaches a cache, counted, answered as a prefill.
const ns = redis('--scan', '--pattern', '*:e:*').split('\n')[0].replace(/e:[0-9a-f]+$/, '');
const ours = () => redis('--scan', '--pattern', `${ns}e:*`).split('\n').filter(Boolean);
const rewrite = (lua) => (key) => redis('EVAL', `local v = redis.call('GET', KEYS[1]) ${lua} return #v`, '1', key);
await ask(foreignUrl, [{ role: 'user', content: 'Once upon a time' }]);
let foreignKey = '';
for (let i = 0; i < 100 && !foreignKey; ++i, await sleep(50)) {
  foreignKey = redis('--scan', '--pattern', '*:e:*').split('\n').find((k) => k && !k.startsWith(ns)) || '';
}
assert.ok(foreignKey, 'the other model wrote no entry');
const damages = [
  ['corrupted', 'a flipped byte', rewrite(`local i = math.floor(#v / 2) redis.call('SET', KEYS[1], string.sub(v, 1, i - 1) .. string.char((string.byte(v, i) + 1) % 256) .. string.sub(v, i + 1), 'KEEPTTL')`)],
  ['corrupted', 'cut short', rewrite(`redis.call('SET', KEYS[1], string.sub(v, 1, #v - 1000), 'KEEPTTL')`)],
  ['foreign', "another model's entry", (key) => redis('COPY', foreignKey, key, 'REPLACE')],
];
for (const [i, [fault, what, damage]] of damages.entries()) {
  await written();
  const before = new Set(ours());
  const c = new Conversation(12 + i);
  const first = await c.turn(questions[0]);
  await written();
  const live = ours().filter((k) => !before.has(k));
  assert.ok(live.length >= 2, `turn 1 wrote ${live.length} entries`);
  live.forEach(damage);
  const refused = await metric(`store_entries_refused_total{fault="${fault}"}`);
  const got = await c.turn(questions[1], freshUrl);  // answered as a server keeping nothing answers it
  assert.notEqual(got.replica, first.replica, 'the second turn must land on another replica to read the store');
  assert.equal(got.cached, 0, `${what}: the damaged entry was used`);
  assert.equal(await metric(`store_entries_refused_total{fault="${fault}"}`), refused + 1, `${what}: not counted`);
  log(`C: ${what} under ${live.length} live keys: refused as ${fault}, answered by a full prefill`);
}

// D. Redis stopped, a replica started while it is down, Redis back.
cluster('stop-one', 'redis');
const outage = new Conversation(15);
for (let t = 0; t < 3; ++t) await c_turn(outage, t);
async function c_turn(c, t) {  // served, whatever it could resume (its answer is checked when it resumed nothing)
  c.say(questions[t]);
  const got = await ask(clusterUrl, c.messages);
  c.messages.push({ role: 'assistant', content: got.text });
  c.turns.push(got);
}
assert.equal(await metric('store_up'), 0, 'a replica reports its store up while Redis is stopped');
cluster('start-one', victim);  // starts with its store unreachable
assert.equal((await (await fetch(`${clusterUrl}/health`)).json()).status, 'ok');
for (let t = 3; t < 5; ++t) await c_turn(outage, t);
log('D: Redis stopped: 5 turns served by the replicas\' own caches, a replica started meanwhile');
const reconnects = await metric('store_reconnects_total');
cluster('start-one', 'redis');
for (let i = 0; i < 60 && await metric('store_up') < replicaNames().length; ++i) await sleep(100);
assert.equal(await metric('store_up'), replicaNames().length, 'not every replica connected again within 6 s');
assert.ok(await metric('store_reconnects_total') >= reconnects + replicaNames().length, 'reconnections not counted');
const hits = await metric('store_hits_total');
const back = new Conversation(16);
// Each turn on the next replica, asked directly: HAProxy's rotation is uneven right after a server comes back up (a
// turn can land where the one before did), and this phase is about the store, not the balancer (phase A checks that).
const names = replicaNames();
for (let t = 0; t < 5; ++t) {
  await written();  // the turn before is in the store
  const name = names[t % names.length];
  const got = await back.turn(questions[t], refUrl, `http://127.0.0.1:${fs.readFileSync(`${clusterDir}/${name}.port`, 'utf8').trim()}`);
  assert.ok(t === 0 || got.cached > 0, `turn ${t + 1} on ${name} after Redis came back: nothing cached`);
}
assert.ok(await metric('store_hits_total') - hits >= 4, 'store hits not counted');
log('D: Redis back: every replica connected again (counted); 4 turns, each on another replica, resumed from the store');
