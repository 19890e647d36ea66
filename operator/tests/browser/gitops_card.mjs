// A proposal delivered through Git, in headless Chromium (cluster mode): the card names
// who applies the target and the file and field, shows the unified diff with the removed
// and added line marked (not only coloured), and once pushed the change request's link and
// state. Run by operator/tests/it/gitops.rs.
import { launch } from './lib.mjs';
import assert from 'node:assert/strict';

const base = process.env.KORTEX_URL;
const request = process.env.KORTEX_REQUEST_URL;
const shots = process.env.SCREENSHOTS;
const browser = await launch();
try {
  const page = await (await browser.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  await page.goto(`${base}/#/proposals`);
  const card = page.locator('article.proposal', { hasText: 'as a Git change' }).first();
  await card.waitFor();
  const git = await card.locator('dl.git').innerText();
  assert.match(git, /Applied by\s+Application argocd\/shop/);
  assert.match(git, /File\s+apps\/api\/api\.yaml \(main at [0-9a-f]{12}\)/);
  const removed = card.locator('pre.gitdiff .line.del');
  const added = card.locator('pre.gitdiff .line.add');
  assert.equal(await removed.count(), 1, 'one removed line');
  assert.equal(await added.count(), 1, 'one added line');
  assert.equal(await removed.textContent(), 'removed: -  replicas: 2 # raised for the sale');
  assert.equal(await added.textContent(), 'added: +  replicas: 5 # raised for the sale');
  const link = card.locator('p.request-state a.request');
  await link.waitFor();
  assert.equal(await link.getAttribute('href'), request);
  assert.equal(await card.locator('p.request-state').getAttribute('data-state'), 'open');
  // The pinned change is the diff, not a wall of raw parameters.
  assert.doesNotMatch(await card.innerText(), /"baseCommit"/);
  if (shots) await page.screenshot({ path: `${shots}/proposal-git.png`, fullPage: true });
  console.log('- the Git proposal shows its owner, file, one-line diff and open request');
  assert.deepEqual(problems, [], problems.join('\n'));
} finally {
  await browser.close();
}
