// The dashboard's layout in headless Chromium, at 1366×860 and 390 px wide: a proposal card
// that arrives live in a transcript the reader is following is scrolled fully into view
// (and the answer after it followed too); on the Proposals page nothing in a card — the
// command line and its Copy button, Confirm/Reject, the rationale — pokes out of the card;
// at 390 px no page scrolls sideways: the first screen, a conversation, Proposals, Status,
// Usage, Evals.
// Run by operator/tests/it/dashboard.rs.
import assert from 'node:assert/strict';
import { launch, step, tour, watchProblems } from './lib.mjs';

const base = process.env.KORTEX_URL;
const shots = process.env.SCREENSHOTS;
const ROUNDS = 4;
const browser = await launch();
try {
  const context = await browser.newContext({ viewport: { width: 1366, height: 860 } });
  const page = await context.newPage();
  const problems = watchProblems(page);
  // Each check's failure, gathered: one run says everything that is wrong.
  const failures = [];
  const check = (ok, what) => { if (!ok) failures.push(what); };
  const ask = async (text) => {
    await page.getByRole('textbox', { name: 'Message', exact: true }).fill(text);
    await page.getByRole('textbox', { name: 'Message', exact: true }).press('Enter');
  };
  const idle = () => page.locator('#session-status').filter({ hasText: /^idle$/ }).waitFor({ timeout: 20000 });

  await page.goto(`${base}/#/chat`);
  await page.getByLabel('New session').fill('incident-layout');
  await page.getByRole('button', { name: 'Create session' }).click();
  await page.getByRole('heading', { name: 'incident-layout' }).waitFor();
  const sessionUrl = page.url();
  // A long answer first: the transcript scrolls, and the reader is at its end.
  await ask('Show me 40 lines of history');
  await page.locator('.msg.assistant', { hasText: 'line 40:' }).waitFor();
  await idle();

  // Each question brings a proposal card while the reader follows: the card ends fully in
  // view, and so does the answer after it. A card comes in a burst of events (the chips'
  // scrolls, then "Loading proposal…"); the race it lost was not every time, hence rounds.
  for (let round = 1; round <= ROUNDS; round += 1) {
    await ask(`Should we restart checkout? (round ${round})`);
    await page.locator('article.proposal').nth(round - 1).waitFor({ timeout: 20000 });
    const inView = await page.waitForFunction((n) => {
      const t = document.getElementById('transcript');
      const card = document.querySelectorAll('#transcript article.proposal')[n];
      if (!t || !card) return false;
      const tr = t.getBoundingClientRect();
      const cr = card.getBoundingClientRect();
      const atEnd = t.scrollHeight - t.scrollTop - t.clientHeight <= 2;
      return atEnd && cr.top >= tr.top - 1 && cr.bottom <= tr.bottom + 1;
    }, round - 1, { timeout: 3000 }).then(() => true, () => false);
    const where = await page.evaluate(() => {
      const t = document.getElementById('transcript');
      return `${Math.round(t.scrollHeight - t.scrollTop - t.clientHeight)} px short of the end`;
    });
    check(inView, `round ${round}: the live proposal card is scrolled fully into view (the transcript stopped ${where})`);
    await idle();
    const short = await page.evaluate(() => {
      const t = document.getElementById('transcript');
      return Math.round(t.scrollHeight - t.scrollTop - t.clientHeight);
    });
    check(short <= 2, `round ${round}: the answer after the card is followed too (${short} px short of the end)`);
  }
  step(`${ROUNDS} live proposal cards arrived`);

  // The Proposals page: nothing inside a card is wider than the card.
  await page.getByRole('link', { name: 'Proposals' }).click();
  await page.locator('article.proposal[data-phase="Pending"] .command').first().waitFor();
  const spills = await page.evaluate(() => {
    const out = [];
    for (const card of document.querySelectorAll('article.proposal')) {
      const cr = card.getBoundingClientRect();
      if (card.scrollWidth > card.clientWidth + 1) out.push(`card ${card.dataset.proposal}: content ${card.scrollWidth} px in ${card.clientWidth} px`);
      for (const el of card.querySelectorAll('*')) {
        const r = el.getBoundingClientRect();
        if (r.width === 0 || r.height === 0) continue;
        const name = `${el.tagName.toLowerCase()}${el.className && typeof el.className === 'string' ? `.${el.className.split(' ').join('.')}` : ''}`;
        if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).display !== 'inline') {
          out.push(`${name} "${(el.textContent || '').trim().slice(0, 30)}": content ${el.scrollWidth} px in ${el.clientWidth} px`);
        }
        if (r.left < cr.left - 1 || r.right > cr.right + 1) {
          out.push(`${name} "${(el.textContent || '').trim().slice(0, 30)}": ${Math.round(r.left)}–${Math.round(r.right)} outside the card's ${Math.round(cr.left)}–${Math.round(cr.right)}`);
        }
      }
    }
    return out;
  });
  assert.ok(await page.locator('article.proposal').count() >= ROUNDS, 'the cards are on the Proposals page');
  if (shots) await page.screenshot({ path: `${shots}/proposals-wide.png`, fullPage: true });
  check(spills.length === 0, `something overflows a proposal card at 1366×860:\n${spills.slice(0, 12).join('\n')}`);
  step('Proposals at 1366×860 measured');

  // A phone: no page scrolls sideways.
  const phone = await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true });
  const small = await phone.newPage();
  small.on('pageerror', (e) => problems.push(`phone page error: ${e.message}`));
  const wide = async (label) => {
    const w = await small.evaluate(() => ({ scroll: document.documentElement.scrollWidth, inner: window.innerWidth }));
    if (shots) await small.screenshot({ path: `${shots}/phone-${label}.png`, fullPage: true });
    check(w.scroll <= 390 && w.inner <= 390, `${label} at 390 px: the page is ${w.scroll} px wide (layout viewport ${w.inner} px)`);
  };
  await tour(small, [
    [`${base}/#/chat`, (p) => p.getByLabel('New session').waitFor(), 'landing'],
    [sessionUrl, async (p) => {
      await p.locator('#transcript article.proposal').nth(ROUNDS - 1).waitFor();
      await p.locator('.msg.md .code').first().waitFor();
    }, 'conversation'],
    [`${base}/#/proposals`, (p) => p.locator('article.proposal .command').first().waitFor(), 'proposals'],
    [`${base}/#/status`, (p) => p.locator('tr[data-policy]').first().waitFor(), 'status'],
    [`${base}/#/usage?since=30d&by=provider`, (p) => p.locator('table.usage-table').waitFor(), 'usage'],
    [`${base}/#/evals`, (p) => p.getByText('No recorded eval yet').waitFor(), 'evals'],
  ], wide);
  await phone.close();
  step('the landing page, the conversation, Proposals, Status, Usage and Evals measured at 390 px');

  assert.deepEqual(failures, [], `\n${failures.join('\n')}`);
  step('cards in view; nothing spills out of a proposal card; nothing scrolls sideways at 390 px');
  assert.deepEqual(problems, [], problems.join('\n'));
} finally {
  await browser.close();
}
