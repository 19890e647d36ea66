// A proposal card in cluster mode, in headless Chromium: the dry-run preview as a
// before/after table with the changed field marked, and the exact kubectl line to decide it
// from a terminal. Run by operator/tests/it/dashboard.rs.
import { launch } from './lib.mjs';
import assert from 'node:assert/strict';

const base = process.env.KORTEX_URL;
const shots = process.env.SCREENSHOTS;
const browser = await launch();
try {
  const page = await (await browser.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  await page.goto(`${base}/#/proposals`);
  const card = page.locator('article.proposal', { hasText: 'scale' }).first();
  await card.waitFor();
  const row = card.locator('table.diff tr[data-field="replicas"]');
  await row.waitFor();
  assert.equal(await row.getAttribute('class'), 'changed');
  assert.equal(await row.locator('td').first().innerText(), '2', 'now');
  assert.equal(await row.locator('td strong').innerText(), '5', 'after, emphasised');
  assert.match(await card.locator('.command code').innerText(), /^kubectl kortex approve scale-api-\S+ -n shop$/);
  if (shots) await page.screenshot({ path: `${shots}/proposal-diff.png`, fullPage: true });
  console.log('- the scale proposal shows replicas 2 -> 5 as a change, and its kubectl line');
  assert.deepEqual(problems, [], problems.join('\n'));
} finally {
  await browser.close();
}
