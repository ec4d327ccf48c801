// The chat page at / in a real browser: Debian's chromium, headless, driven by puppeteer-core (tests/server/test-page.sh
// starts the servers and computes the independent count).
//   node tests/server/page.mjs URL KEYED_URL KEY IMAGE ANALYSIS_JSON HUGE_PNG SCREENSHOT_DIR
// URL serves tiny-qwen2vl at budget 100; KEYED_URL the same behind --api-key KEY. ANALYSIS_JSON is `ecokv analyze
// --out` on the same prompt: its kept_share times the (layer, head) pairs is the count of heads keeping each cell.
import fs from 'node:fs';
import puppeteer from 'puppeteer-core';

const [url, keyedUrl, key, image, analysisPath, hugePng, shots] = process.argv.slice(2);
let failures = 0;
const ok = (cond, what, detail = '') => {
  console.log(`${cond ? 'ok' : 'not ok'} - ${what}${cond || !detail ? '' : `: ${detail}`}`);
  if (!cond) ++failures;
};

const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
// Errors in the console or uncaught exceptions fail the test. Chromium also logs every HTTP error response as a
// console error; those of the requests made to fail here (401, 400) are expected and left out.
const errors = [];
async function open(at, width = 1280, height = 800) {
  const page = await browser.newPage();
  page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/status of (400|401)/.test(m.text())) errors.push(`console: ${m.text()}`);
  });
  await page.setViewport({ width, height });
  await page.goto(at, { waitUntil: 'load' });
  return page;
}
const text = (page, sel) => page.$eval(sel, (e) => e.textContent);
const answerOf = (page, log) => page.$$eval(`#${log} .msg.assistant`, (m) => m.map((x) => x.textContent));

try {
  // A question about the receipt, compressed and full side by side.
  const page = await open(url);
  await page.waitForSelector('#scorer option');
  const method = await page.$eval('#allocator', (s) => s.value) + '+' + await page.$eval('#scorer', (s) => s.value);
  ok(method === 'uniform+ecokv' && await page.$eval('#budget', (b) => b.value) === '100',
     'the method and budget shown are the server\'s', method);
  await page.click('#compare');
  await (await page.$('#image-input')).uploadFile(image);
  await page.waitForFunction(() => document.getElementById('preview').src.startsWith('data:image/png'));
  await page.type('#question', 'What is the TOTAL?');
  await page.click('#send');
  await page.waitForFunction(() => document.querySelectorAll('#heatmap div').length > 0 &&
                                   document.querySelectorAll('#chat-full .msg.assistant').length === 1 &&
                                   !document.getElementById('send').disabled, { timeout: 60000 });
  const [answer] = await answerOf(page, 'chat'), [full] = await answerOf(page, 'chat-full');
  ok(answer.includes('64.02'), 'the compressed cache answers 64.02', answer);
  ok(full.includes('64.02'), 'the full cache beside it answers 64.02', full);
  ok(await page.$$eval('#chat .msg.assistant', (m) => m.every((x) => x.children.length === 0)),
     'answers are text nodes, never HTML');

  // The page's heatmap against the endpoint, the endpoint against ecokv analyze.
  const shown = await page.$$eval('#heatmap div', (ds) => ds.map((d) => [Number(d.dataset.cell), Number(d.dataset.count)]));
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ max_tokens: 8, kv_kept: true, kv_compression: { method, budget: 100 },
      messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: `data:image/png;base64,${fs.readFileSync(image).toString('base64')}` } },
                                           { type: 'text', text: 'What is the TOTAL?' }] }] }),
  });
  const kept = (await res.json()).kv_kept;
  const grid = kept.images[0];
  ok(shown.length === grid.rows * grid.cols, `the heatmap has a patch per image token (${grid.rows}x${grid.cols})`,
     `${shown.length}`);
  ok(shown.every(([cell, count]) => kept.counts[cell] === count), 'the page\'s per-patch counts equal the endpoint\'s');
  const analysis = JSON.parse(fs.readFileSync(analysisPath, 'utf8'));
  const pairs = kept.n_layers * kept.n_kv_heads;
  const independent = analysis.kept_share.map((s) => Math.round(s * pairs));
  ok(independent.length === kept.first_new_cell && independent.every((c, i) => c === kept.counts[i]),
     `the endpoint's counts over the ${independent.length} context cells equal ecokv analyze's`);
  const layout = analysis.images[0];
  ok(layout.rows === grid.rows && layout.cols === grid.cols && layout.first_cell === grid.first_cell,
     'the image grid is analyze\'s');

  // One head's kept set.
  await page.select('#head', '1,0');
  const one = await page.$$eval('#heatmap div', (ds) => ds.map((d) => [Number(d.dataset.cell), Number(d.dataset.count)]));
  const held = new Set(kept.heads[1][0]);
  ok(one.every(([cell, count]) => count === (held.has(cell) ? 1 : 0)), 'layer 1, KV head 0 shows its own kept patches',
     `${one.filter(([, c]) => c).length} shown`);
  const memory = await text(page, '#memory');
  ok(memory.includes(`of ${(kept.bytes_full / 1024).toFixed(1)} KiB`), 'the memory bar shows the full cache\'s bytes', memory);
  await page.select('#head', 'all');
  await page.screenshot({ path: `${shots}/chat-page.png` });

  // A second turn continues the conversation.
  await page.type('#question', 'What is the TAX?');
  await page.click('#send');
  await page.waitForFunction(() => document.querySelectorAll('#chat .msg.assistant').length === 2 &&
                                   !document.getElementById('send').disabled, { timeout: 60000 });
  const answers = await answerOf(page, 'chat');
  ok(answers[1].length > 0 && (await text(page, '#error')) === '', 'a second turn is answered', answers[1]);

  // A phone's width: one column, nothing wider than the screen.
  await page.setViewport({ width: 390, height: 844 });
  ok(await page.evaluate(() => document.documentElement.scrollWidth <= 390), 'at 390 px nothing overflows');
  await page.screenshot({ path: `${shots}/chat-page-phone.png`, fullPage: true });

  // An image over the server's limit: the server's own message.
  const big = await open(url);
  await big.waitForSelector('#scorer option');
  await (await big.$('#image-input')).uploadFile(hugePng);
  await big.waitForFunction(() => document.getElementById('preview').src.startsWith('data:'));
  await big.type('#question', 'What is it?');
  await big.click('#send');
  await big.waitForFunction(() => document.getElementById('error').textContent !== '', { timeout: 30000 });
  const refused = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: `data:image/png;base64,${fs.readFileSync(hugePng).toString('base64')}` } }, { type: 'text', text: 'What is it?' }] }] }),
  });
  const message = (await refused.json()).error.message;
  ok(refused.status === 400 && await text(big, '#error') === message, 'a huge image shows the server\'s message',
     await text(big, '#error'));

  // An API key: asked for, a wrong one refused with the server's 401 message, the right one taken.
  const keyed = await open(keyedUrl);
  await keyed.waitForFunction(() => document.getElementById('key-row').classList.contains('shown'));
  await keyed.type('#api-key', 'wrong');
  await keyed.click('#key-save');
  await keyed.waitForFunction(() => document.getElementById('error').textContent !== '');
  const wrong = await text(keyed, '#error');
  ok(wrong.startsWith('Incorrect or missing API key') && await keyed.$eval('#key-row', (r) => r.classList.contains('shown')),
     'a wrong key shows the 401 message', wrong);
  await keyed.$eval('#api-key', (i) => { i.value = ''; });
  await keyed.type('#api-key', key);
  await keyed.click('#key-save');
  await keyed.waitForFunction(() => !document.getElementById('key-row').classList.contains('shown') &&
                                    document.querySelectorAll('#scorer option').length > 0);
  ok(true, 'the right key opens the page');
  await keyed.screenshot({ path: `${shots}/chat-page-key.png` });
} catch (e) {
  ok(false, 'the page test ran to its end', e.stack);
} finally {
  await browser.close();
}
ok(errors.length === 0, 'no JavaScript errors in the console', errors.join('; '));
process.exit(failures ? 1 : 0);
