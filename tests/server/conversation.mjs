// A long conversation about one image through ecokv serve, with the official openai client: TURNS questions asked one
// after another in one conversation (each earlier answer sent back, as a chat client does), compressed to BUDGET
// entries per head (BUDGET 0: the full cache) and, with SLACK >= 0, compressed again after each answer
// (kv_compression.recompress_slack). Questions (and answers, to score) from ITEMS (a dataset's items.jsonl), else
// receipt questions. Prints one JSON line per turn; asserts what docs/conversations.md promises:
//  - every turn after the first is a hit on the kept conversation (only the new message is prefilled);
//  - with SLACK >= 0, the longest KV head holds at most BUDGET + SLACK + that turn's cells after the turn.
//   node conversation.mjs URL IMAGE TURNS BUDGET SLACK [MODEL] [ITEMS]
import assert from 'node:assert/strict';
import fs from 'node:fs';
import OpenAI from 'openai';

const [url, imagePath, turnsArg, budgetArg, slackArg, model = '', itemsPath = ''] = process.argv.slice(2);
const [turns, budget, slack] = [turnsArg, budgetArg, slackArg].map(Number);
const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'not-needed', maxRetries: 0 });
const image = `data:image/png;base64,${fs.readFileSync(imagePath).toString('base64')}`;
const items = itemsPath
  ? fs.readFileSync(itemsPath, 'utf8').trim().split('\n').map((line) => JSON.parse(line))
  : ['What is the TOTAL?', 'What is the TAX?', 'Read the first line.', 'What is the DATE?', 'What is the last item?',
    'What is the SUBTOTAL?', 'How many items are there?', 'Read the second line.'].map((question) => ({ question }));

const kv = budget === 0 ? false : slack >= 0 ? { budget, recompress_slack: slack } : { budget };
const messages = [];
for (let turn = 0; turn < turns; ++turn) {
  const { question, answers } = items[turn % items.length];
  messages.push(turn === 0
    ? { role: 'user', content: [{ type: 'image_url', image_url: { url: image } }, { type: 'text', text: question }] }
    : { role: 'user', content: question });
  const r = await client.chat.completions.create({ model, max_tokens: 12, kv_compression: kv, messages });
  const answer = r.choices[0].message;
  messages.push({ role: 'assistant', content: answer.content });
  const u = r.usage;
  // This turn's cells: the prefilled message and every answer token decoded (all but the last when cut at max_tokens).
  const decoded = r.choices[0].finish_reason === 'length' ? u.completion_tokens - 1 : u.completion_tokens;
  const turnCells = u.prefilled_tokens + decoded;
  console.log(JSON.stringify({ turn: turn + 1, prompt_tokens: u.prompt_tokens, prefilled: u.prefilled_tokens,
    turn_cells: turnCells, entries_held: u.kv_entries_held, recompressions: u.kv_recompressions,
    kv_bytes_kept: u.kv_bytes_kept, kv_bytes_full: u.kv_bytes_full, question, answer: answer.content,
    correct: answers ? answers.includes(answer.content.trim()) : null }));
  if (turn > 0) {
    assert.equal(u.prompt_tokens_details.cached_tokens + u.prefilled_tokens, u.prompt_tokens);
    assert.ok(u.prefilled_tokens < 40, `turn ${turn + 1} prefilled ${u.prefilled_tokens}: not a hit`);
  }
  if (budget > 0 && slack >= 0) {
    assert.ok(u.kv_entries_held <= budget + slack + turnCells,
      `turn ${turn + 1}: ${u.kv_entries_held} entries > ${budget} + ${slack} + ${turnCells}`);
  }
}
