// Shares and hands over a session from the Kortex dashboard in headless Chromium: Alice
// shares her investigation (read for Bob, continue for Dave, then revokes Dave) and hands it
// over to Carol with a note; Carol finds it under "Shared with me", reads who asked what and
// the hand-over summary, and continues; Alice sees Carol's question arrive; Bob may only
// read. Run by operator/tests/it/dashboard.rs.
import { launch } from './lib.mjs';
import assert from 'node:assert/strict';

const base = process.env.KORTEX_URL;
const keys = JSON.parse(process.env.KORTEX_KEYS);
const summary = process.env.KORTEX_SUMMARY;
const shots = process.env.SCREENSHOTS;
const browser = await launch();
const step = (s) => console.log(`- ${s}`);
const problems = [];
const signedIn = async (user) => {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await context.newPage();
  page.on('pageerror', (e) => problems.push(`${user}: page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error' && !/status of (401|403|404)/.test(m.text())) problems.push(`${user}: console: ${m.text()}`); });
  await page.goto(`${base}/`);
  await page.getByLabel('Token or API key').fill(keys[user]);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#user').filter({ hasText: user }).waitFor();
  return page;
};
const ask = async (page, text) => {
  await page.getByRole('textbox', { name: 'Message', exact: true }).fill(text);
  await page.getByRole('textbox', { name: 'Message', exact: true }).press('Enter');
};
try {
  // Alice investigates.
  const alice = await signedIn('alice');
  await alice.getByLabel('New session').fill('incident-db');
  await alice.getByRole('button', { name: 'Create session' }).click();
  await alice.getByRole('heading', { name: 'incident-db' }).waitFor();
  await ask(alice, 'Why is the database slow?');
  await alice.locator('.msg.assistant', { hasText: 'The connection pool is exhausted.' }).waitFor();
  await alice.locator('#session-status').filter({ hasText: 'idle' }).waitFor();
  step('alice asked and got an answer');

  // The share dialog: Bob to read, Dave to continue, then Dave revoked.
  await alice.getByRole('button', { name: 'Share' }).click();
  const share = alice.getByRole('dialog', { name: 'Share incident-db' });
  await share.getByText('Not shared with anyone.').waitFor();
  await share.getByLabel('Users').fill('bob');
  await share.getByLabel('Access').selectOption('read');
  await share.getByRole('button', { name: 'Share', exact: true }).click();
  await share.locator('li[data-share="user:bob"]', { hasText: 'read' }).waitFor();
  await share.getByLabel('Users').fill('dave');
  await share.getByLabel('Access').selectOption('continue');
  await share.getByRole('button', { name: 'Share', exact: true }).click();
  await share.locator('li[data-share="user:dave"]', { hasText: 'continue' }).waitFor();
  await alice.screenshot({ path: `${shots}/share-dialog.png` });
  await share.getByRole('button', { name: 'Revoke user dave' }).click();
  await share.locator('li[data-share="user:dave"]').waitFor({ state: 'detached' });
  assert.equal(await share.locator('li[data-share]').count(), 1, 'only bob is left');
  await share.getByRole('button', { name: 'Close' }).click();
  await share.waitFor({ state: 'detached' });
  step('shared with bob to read; dave shared and revoked');

  // Hand over to Carol with a note: a card with the note and the summary.
  await alice.getByRole('button', { name: 'Hand over' }).click();
  const hand = alice.getByRole('dialog', { name: 'Hand over incident-db' });
  await hand.getByLabel('To').fill('carol');
  await hand.getByLabel('Note').fill('Pool resize proposed; watch p99 latency after it.');
  await hand.getByRole('button', { name: 'Hand over' }).click();
  await hand.waitFor({ state: 'detached' });
  const card = alice.locator('article.handover');
  await card.getByText('alice handed this session over to carol').waitFor();
  await card.getByText('Pool resize proposed; watch p99 latency after it.').waitFor();
  await card.getByText(summary).waitFor();
  await alice.screenshot({ path: `${shots}/handover.png`, fullPage: true });
  step('handed over to carol: the card shows the note and the summary');

  // Carol finds it under "Shared with me" and continues.
  const carol = await signedIn('carol');
  const shared = carol.locator('#shared-sessions li', { hasText: 'incident-db' });
  await shared.getByText('alice · you may continue').waitFor();
  await shared.getByRole('link').click();
  await carol.getByRole('heading', { name: 'incident-db' }).waitFor();
  await carol.getByText("alice's session · you may continue").waitFor();
  await carol.locator('.msg.user[data-author="alice"] .author', { hasText: 'alice' }).waitFor();
  await carol.locator('article.handover').getByText(summary).waitFor();
  assert.equal(await carol.getByRole('button', { name: 'Share' }).count(), 0, 'only the owner shares');
  await ask(carol, 'Is the pool resize safe?');
  await carol.locator('.msg.assistant', { hasText: 'Yes, within the memory limit.' }).waitFor();
  await carol.locator('#session-status').filter({ hasText: 'idle' }).waitFor();
  assert.equal(await carol.locator('.msg.user[data-author="carol"] .author').count(), 0, 'her own questions are not labelled');
  step('carol continued the investigation');

  // Alice, still watching, sees Carol's question with her name.
  await alice.locator('.msg.user[data-author="carol"] .author', { hasText: 'carol' }).waitFor();
  await alice.locator('.msg.assistant', { hasText: 'Yes, within the memory limit.' }).waitFor();
  step("alice saw carol's question and its answer live");

  // Bob may read only: no composer, no hand-over.
  const bob = await signedIn('bob');
  await bob.locator('#shared-sessions li', { hasText: 'incident-db' }).getByText('alice · read only').waitFor();
  await bob.locator('#shared-sessions li', { hasText: 'incident-db' }).getByRole('link').click();
  await bob.locator('#read-only').waitFor();
  assert.equal(await bob.getByRole('textbox', { name: 'Message', exact: true }).count(), 0, 'no composer');
  assert.equal(await bob.getByRole('button', { name: 'Hand over' }).count(), 0, 'no hand-over');
  await bob.locator('.msg.user[data-author="carol"]').waitFor();
  await bob.screenshot({ path: `${shots}/shared-read-only.png`, fullPage: true });
  step('bob reads without a composer');

  assert.deepEqual(problems, [], 'no script errors');
} finally {
  await browser.close();
}
