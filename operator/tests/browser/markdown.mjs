// Markdown answers in the Kortex dashboard, in headless Chromium: a streamed answer with a
// table, a YAML code block (highlighted, with a copy button), a list and links renders as
// such; a <script> and raw HTML in model output stay text; a javascript: link is not a link;
// the rendering survives a reload; session search, filters and rename; the usage page and its CSV; dark mode follows the system and the toggle. Run by operator/tests/it/dashboard.rs.
import { launch } from './lib.mjs';
import assert from 'node:assert/strict';

const base = process.env.KORTEX_URL;
const shots = process.env.SCREENSHOTS;
const browser = await launch();
const step = (s) => console.log(`- ${s}`);
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  await context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: base });
  const page = await context.newPage();
  const problems = [];
  const dialogs = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  let streamBlocked = false;
  page.on('console', (m) => {
    if (m.type() !== 'error') return;
    // The event stream refused on purpose (below) logs its failed loads.
    if (streamBlocked && m.text().includes('net::ERR_FAILED')) return;
    problems.push(`console: ${m.text()}`);
  });
  let renameTo = null;
  let confirmDelete = null;
  page.on('dialog', (d) => {
    if (d.type() === 'prompt' && renameTo) d.accept(renameTo);
    else if (d.type() === 'confirm' && confirmDelete !== null) {
      dialogs.push(d.message());
      if (confirmDelete) d.accept(); else d.dismiss();
    } else { dialogs.push(d.message()); d.dismiss(); }
  });
  await page.goto(`${base}/#/chat`);
  await page.getByLabel('New session').fill('incident-md');
  await page.getByRole('button', { name: 'Create session' }).click();
  await page.getByRole('heading', { name: 'incident-md' }).waitFor();
  const sessionUrl = page.url();
  await page.getByRole('textbox', { name: 'Message', exact: true }).fill('Summarize the pods');
  await page.getByRole('textbox', { name: 'Message', exact: true }).press('Enter');
  await page.locator('#session-status').filter({ hasText: 'idle' }).waitFor({ timeout: 30000 });

  const check = async (when) => {
    const msg = page.locator('.msg.assistant.md').last();
    await msg.locator('table').waitFor();
    assert.deepEqual(await msg.locator('thead th').allInnerTexts(), ['Pod', 'Restarts', 'Reason'], when);
    assert.equal(await msg.locator('tbody tr').count(), 2, when);
    assert.equal(await msg.locator('tbody tr').first().locator('td').nth(1).innerText(), '14', when);
    assert.equal(await msg.locator('h3, h4, h5, h6').first().innerText(), 'Findings', when);
    assert.equal(await msg.locator('ul > li').count(), 2, when);
    assert.deepEqual(await msg.locator('li code').allInnerTexts(), ['checkout-7d9', 'OOMKilled'], when);
    assert.equal(await msg.locator('strong').first().innerText(), 'memory limit', when);
    const code = msg.locator('.code code.lang-yaml');
    assert.match(await code.innerText(), /resources:\n\s+limits:\n\s+memory: 512Mi/, when);
    assert.ok(await code.locator('span.tok-key').count() >= 2, `${when}: YAML keys are highlighted`);
    const link = msg.locator('a', { hasText: 'the runbook' });
    assert.equal(await link.getAttribute('href'), 'https://runbooks.example.com/checkout', when);
    assert.equal(await link.getAttribute('rel'), 'noopener noreferrer', when);
    // What must stay text.
    assert.equal(await msg.locator('script, img, iframe').count(), 0, `${when}: no element from model output`);
    assert.ok((await msg.innerText()).includes('<script>alert("x")</script>'), `${when}: the script shows as text`);
    assert.ok((await msg.innerText()).includes('<img src=x onerror=alert(1)>'), `${when}: raw HTML shows as text`);
    assert.equal(await msg.locator('a', { hasText: 'click me' }).count(), 0, `${when}: a javascript: link is no link`);
    assert.deepEqual(dialogs, [], `${when}: nothing ran`);
    // Who answered: the provider resource and the model its server reported.
    assert.equal(await msg.locator('.served-by').innerText(), 'scripted · gpt-test', `${when}: the provider and model`);
  };
  await check('streamed');
  step('the streamed answer rendered as Markdown: heading, list, table, highlighted YAML, link, who answered');

  // The summarize model's incident summary (the title) reaches the list without a reload.
  const item = page.locator('aside.sessions li', { has: page.locator('.summary', { hasText: process.env.KORTEX_SUMMARY }) });
  await item.waitFor();
  await item.locator('.t', { hasText: /^ops · idle · / }).waitFor();
  step('the incident summary shows in the session list');

  // The copy button puts the code itself on the clipboard.
  await page.locator('.msg.assistant.md .code button.copy').first().click();
  await page.locator('.msg.assistant.md .code button.copy', { hasText: 'Copied' }).waitFor();
  const copied = await page.evaluate(() => navigator.clipboard.readText());
  assert.match(copied, /^resources:\n  limits:\n    memory: 512Mi$/);
  step('copy button copies the code block');

  await page.reload();
  await page.locator('#session-status').filter({ hasText: 'idle' }).waitFor();
  await check('after a reload');
  // Relative times, the exact time on hover.
  const when = page.locator('.msg.assistant .when time').last();
  assert.equal(await when.innerText(), 'just now');
  assert.match(await when.getAttribute('title'), /20\d\d/);
  assert.match(await page.locator('aside.sessions li time').first().innerText(), /just now|min ago/);
  if (shots) await page.screenshot({ path: `${shots}/markdown.png`, fullPage: true });
  step('the stored answer renders the same after a reload');

  // Sessions: search (the text of the conversation counts), filter, rename.
  const sessions = page.locator('aside.sessions ul[aria-label="Sessions"] > li');
  await page.getByRole('searchbox', { name: 'Search sessions' }).fill('SUMMARIZE the pods');
  await sessions.filter({ hasText: 'incident-md' }).waitFor();
  await page.getByRole('searchbox', { name: 'Search sessions' }).fill('no such words anywhere');
  await sessions.filter({ hasText: 'No sessions match.' }).waitFor();
  await page.getByRole('searchbox', { name: 'Search sessions' }).fill('');
  await sessions.filter({ hasText: 'incident-md' }).waitFor();
  await page.getByLabel('Filter by state').selectOption('failed');
  await sessions.filter({ hasText: 'No sessions match.' }).waitFor();
  await page.getByLabel('Filter by state').selectOption('');
  await page.getByLabel('Filter by policy').selectOption('ops');
  await sessions.filter({ hasText: 'incident-md' }).waitFor();
  renameTo = 'Checkout pods summary';
  await page.getByRole('button', { name: 'Rename session incident-md' }).click();
  await sessions.filter({ hasText: 'Checkout pods summary' }).waitFor();
  renameTo = null;
  await page.getByRole('searchbox', { name: 'Search sessions' }).fill('pods summary');
  await sessions.filter({ hasText: 'Checkout pods summary' }).waitFor();
  await page.getByRole('searchbox', { name: 'Search sessions' }).fill('');
  step('sessions: searched by text, filtered by state and policy, renamed and found by the new title');

  // The usage page (the local user is an admin on loopback): by provider, with its CSV.
  await page.getByRole('link', { name: 'Usage' }).click();
  await page.locator('#usage-by').selectOption('provider');
  await page.waitForURL(/by=provider/);
  const row = page.locator('table.usage-table tr[data-key="scripted"]');
  await row.waitFor();
  // The answer, then the summarize model's title and follow-up questions (whose books are
  // written in the background: the page is read again until all three are in).
  for (let i = 0; i < 40 && (await row.locator('td').nth(1).innerText()) !== '3'; i += 1) {
    await page.waitForTimeout(250);
    await page.reload();
    await row.waitFor();
  }
  assert.equal(await row.locator('td').nth(1).innerText(), '3', 'three calls to the scripted provider');
  assert.equal(await page.locator('svg.usage-chart rect').count(), 1);
  const [download] = await Promise.all([page.waitForEvent('download'), page.locator('#usage-csv').click()]);
  assert.equal(download.suggestedFilename(), 'kortex-usage-provider-30d.csv');
  const csv = await (await import('node:fs/promises')).readFile(await download.path(), 'utf8');
  const lines = csv.trim().split('\r\n');
  assert.equal(lines[0], 'key,requests,inputTokens,outputTokens,costUsd,estimatedRequests');
  // The scripted stream reports no usage: Kortex estimated that call (the last column).
  assert.match(lines[1], /^scripted,3,[1-9]\d*,[1-9]\d*,0,1$/);
  if (shots) await page.screenshot({ path: `${shots}/usage.png`, fullPage: true });
  step('usage by provider: chart, table and CSV');
  await page.goto(sessionUrl);
  await page.locator('.msg.assistant.md table').waitFor();

  // The event stream cannot connect, then can again: the page says so meanwhile.
  await page.locator('#reconnecting').waitFor({ state: 'hidden' });
  const events = (url) => url.pathname.endsWith('/events');
  streamBlocked = true;
  await page.route(events, (r) => r.abort());
  await page.reload();
  await page.locator('#reconnecting').waitFor({ state: 'visible', timeout: 15000 });
  await page.unroute(events);
  await page.locator('#reconnecting').waitFor({ state: 'hidden', timeout: 20000 });
  streamBlocked = false;
  step('a dropped event stream shows "reconnecting…" until it is back');

  // A long answer streams slowly: followed while the reader is at the end; once they scroll
  // up to read, it grows below without moving them.
  const transcriptGap = () => page.evaluate(() => {
    const t = document.getElementById('transcript');
    return { top: t.scrollTop, gap: t.scrollHeight - t.scrollTop - t.clientHeight };
  });
  await page.getByRole('textbox', { name: 'Message', exact: true }).fill('Explain it slowly');
  await page.getByRole('textbox', { name: 'Message', exact: true }).press('Enter');
  await page.locator('.msg.assistant.md', { hasText: 'line 20 of the slow answer' }).waitFor();
  assert.ok((await transcriptGap()).gap < 48, 'the answer is followed while the reader is at the end');
  await page.evaluate(() => { document.getElementById('transcript').scrollTop = 0; });
  await page.locator('#session-status').filter({ hasText: 'idle' }).waitFor({ timeout: 30000 });
  assert.match(await page.locator('.msg.assistant.md').last().innerText(), /line 60 of the slow answer/);
  const after = await transcriptGap();
  assert.equal(after.top, 0, 'scrolled up to read: left where they were');
  assert.ok(after.gap > 200, 'the answer grew below');
  step('a streamed answer is followed at the end and leaves a reader who scrolled up in place');

  // Delete, after a confirmation: dismissed, the session stays; accepted, it goes.
  await page.getByLabel('New session').fill('incident-gone');
  await page.getByRole('button', { name: 'Create session' }).click();
  await page.getByRole('heading', { name: 'incident-gone' }).waitFor();
  confirmDelete = false;
  await page.getByRole('button', { name: 'Delete session incident-gone' }).click();
  assert.ok(dialogs.some((m) => m.startsWith('Delete session incident-gone?')), `asked: ${dialogs}`);
  assert.equal(await sessions.filter({ hasText: 'incident-gone' }).count(), 1, 'dismissed: kept');
  confirmDelete = true;
  await page.getByRole('button', { name: 'Delete session incident-gone' }).click();
  await page.waitForURL(/#\/chat$/);
  await sessions.filter({ hasText: 'incident-md' }).waitFor();
  assert.equal(await sessions.filter({ hasText: 'incident-gone' }).count(), 0, 'deleted');
  confirmDelete = null;
  await page.goto(sessionUrl);
  await page.locator('.msg.assistant.md table').waitFor();
  step('delete asks first: dismissed keeps the session, confirmed removes it');

  // Keyboard shortcuts: ? lists them, n and / focus the fields.
  await page.locator('h2, h1').first().click();
  await page.keyboard.press('?');
  await page.getByRole('dialog', { name: 'Keyboard shortcuts' }).waitFor();
  assert.ok((await page.getByRole('dialog').innerText()).includes('Approve the focused proposal'));
  await page.keyboard.press('Escape');
  await page.getByRole('dialog', { name: 'Keyboard shortcuts' }).waitFor({ state: 'hidden' });
  await page.keyboard.press('n');
  assert.equal(await page.evaluate(() => document.activeElement.id), 'new-session-name');
  await page.locator('h2, h1').first().click();
  await page.keyboard.press('/');
  assert.equal(await page.evaluate(() => document.activeElement.id), 'message');
  step('keyboard shortcuts: ? lists them, n and / focus the new-session and message fields');

  // Dark mode follows the system, and the toggle overrides it (kept across reloads).
  const background = () => page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  await page.emulateMedia({ colorScheme: 'dark' });
  assert.equal(await background(), 'rgb(18, 22, 28)', 'dark when the system is');
  await page.waitForFunction(() => document.getElementById('theme').getAttribute('aria-pressed') === 'true');
  if (shots) await page.screenshot({ path: `${shots}/markdown-dark.png`, fullPage: true });
  await page.getByRole('button', { name: 'Dark mode' }).click();
  assert.equal(await background(), 'rgb(246, 247, 249)', 'the toggle chose light');
  assert.equal(await page.locator('#theme').getAttribute('aria-pressed'), 'false');
  await page.reload();
  await page.locator('.msg.assistant.md table').waitFor();
  assert.equal(await background(), 'rgb(246, 247, 249)', 'the choice is kept');
  await page.getByRole('button', { name: 'Dark mode' }).click();
  assert.equal(await background(), 'rgb(18, 22, 28)');
  step('dark mode follows the system; the toggle overrides it and is remembered');
  assert.deepEqual(problems, [], problems.join('\n'));
} finally {
  await browser.close();
}
