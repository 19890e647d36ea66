// Drives the Kortex dashboard in headless Chromium: sign in, create a session, ask a
// question that triggers tool calls, watch the chips and the streamed answer, reload in the
// middle of the stream (no duplicated text), approve the proposal, read the status pages,
// sign out. Screenshots go to $SCREENSHOTS. Run by operator/tests/it/dashboard.rs.
import { assertAccessible, axeViolations, eachScheme, launch, step, watchProblems } from './lib.mjs';
import { mkdirSync } from 'node:fs';
import assert from 'node:assert/strict';

const base = process.env.KORTEX_URL;
const key = process.env.KORTEX_KEY;
const answer = process.env.KORTEX_ANSWER;
const shots = process.env.SCREENSHOTS;
mkdirSync(shots, { recursive: true });

const browser = await launch();
try {
  const context = await browser.newContext({ viewport: { width: 1366, height: 860 } });
  const page = await context.newPage();
  const foreign = [];
  page.on('request', (r) => { if (!r.url().startsWith(base)) foreign.push(r.url()); });
  const problems = watchProblems(page, [], /status of (401|403|422|429)/);

  // The sign-in screen, light and dark, through axe-core.
  const found = [];
  await eachScheme(browser, { width: 1366, height: 860 }, async (p, scheme) => {
    await p.goto(`${base}/`);
    await p.getByLabel('Token or API key').waitFor();
    found.push(...await axeViolations(p, `${scheme} sign-in`));
    await p.screenshot({ path: `${shots}/signin-${scheme}.png`, fullPage: true });
  });
  assertAccessible(found);
  step('the sign-in screen has no serious or critical WCAG violation (light and dark)');

  // Sign in.
  await page.goto(`${base}/`);
  await page.getByLabel('Token or API key').fill('not-a-key');
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('alert').filter({ hasText: 'invalid' }).waitFor();
  await page.getByLabel('Token or API key').fill(key);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#user').filter({ hasText: 'alice (sre)' }).waitFor();
  const cookies = await context.cookies();
  const auth = cookies.find((c) => c.name === 'kortex_auth');
  assert.ok(auth && auth.httpOnly && auth.sameSite === 'Strict', 'the credential is in an HttpOnly SameSite cookie');
  step('signed in as alice (sre)');

  // A session whose name matches no policy is refused with the reason.
  await page.getByLabel('New session').fill('random');
  await page.getByRole('button', { name: 'Create session' }).click();
  await page.getByRole('alert').filter({ hasText: 'ChatPolicy' }).waitFor();
  // Create a session.
  await page.getByLabel('New session').fill('incident-checkout');
  await page.getByRole('button', { name: 'Create session' }).click();
  await page.waitForURL(/#\/chat\/.+/);
  await page.getByRole('heading', { name: 'incident-checkout' }).waitFor();
  await page.getByText('policy incidents', { exact: true }).waitFor();
  const sessionUrl = page.url();
  step('session incident-checkout created under policy incidents');

  // Ask; Enter sends.
  await page.getByRole('textbox', { name: 'Message', exact: true }).fill('Why is checkout failing?');
  await page.getByRole('textbox', { name: 'Message', exact: true }).press('Enter');
  await page.locator('.msg.user', { hasText: 'Why is checkout failing?' }).waitFor();
  const chip = page.locator('details.chip[data-tool="get_incident_history"]');
  await chip.waitFor();
  await page.locator('details.chip.ok[data-tool="get_incident_history"]').waitFor();
  await page.locator('details.chip[data-tool="propose_action"]').waitFor();
  const card = page.locator('article.proposal');
  await card.waitFor();
  assert.equal(await card.getAttribute('data-phase'), 'Pending');
  step('tool chips and the proposal card appeared');

  // Reload in the middle of the streamed answer: nothing is shown twice.
  const firstWords = answer.split(' ').slice(0, 4).join(' ');
  await page.locator('.msg.assistant', { hasText: firstWords }).waitFor();
  const before = await page.locator('#transcript').innerText();
  assert.ok(!before.includes(answer), 'reloading while the answer is still streaming');
  await page.reload();
  await page.locator('#session-status').filter({ hasText: 'idle' }).waitFor({ timeout: 30000 });
  const transcript = await page.locator('#transcript').innerText();
  assert.equal(transcript.split(answer).length - 1, 1, `the answer appears exactly once:\n${transcript}`);
  assert.equal(transcript.split('Why is checkout failing?').length - 1, 1, 'the question appears once');
  assert.equal(await page.locator('details.chip[data-tool="get_incident_history"]').count(), 1, 'one chip per call');
  assert.equal(await page.locator('article.proposal').count(), 1, 'one proposal card');
  step('reloaded mid-stream: the answer is whole and not duplicated');

  // Expand a chip to its result.
  await page.locator('details.chip[data-tool="get_incident_history"] summary').click();
  await page.locator('details.chip[data-tool="get_incident_history"] pre').filter({ hasText: /sessions|proposals/ }).waitFor();
  // A JSON result is shown indented, its keys highlighted.
  // (The chip may be drawn again when the run's events catch up after the reload: wait
  // for its highlighted form rather than count at once.)
  await page.locator('details.chip[data-tool="get_incident_history"] pre span.tok-key').first()
    .waitFor({ timeout: 10000 })
    .catch(() => assert.fail('JSON keys are highlighted'));
  assert.match(await page.locator('details.chip[data-tool="get_incident_history"] pre').innerText(), /^\{\n  "/, 'JSON is indented');
  await page.screenshot({ path: `${shots}/chat.png`, fullPage: true });

  // Approve the proposal from its card, with the keyboard (focus the card, press a); the
  // phase changes.
  // The same decision from a terminal: the exact command, to copy (kortex serve keeps
  // proposals in its database: the kortex CLI, not kubectl).
  const command = await page.locator('article.proposal .command code').innerText();
  assert.match(command, /^kortex proposals approve \S+$/);
  await page.locator('article.proposal').getByLabel(/Reason for deciding/).fill('evidence is clear');
  await page.locator('article.proposal').focus();
  await page.keyboard.press('a');
  await page.locator('article.proposal[data-phase="Approved"]').waitFor();
  await page.locator('article.proposal').getByText('alice: evidence is clear', { exact: true }).waitFor();
  step('proposal approved; the card shows Approved and who decided');

  // The proposals page.
  await page.getByRole('link', { name: 'Proposals' }).click();
  await page.locator('article.proposal[data-phase="Approved"]').waitFor();
  await page.screenshot({ path: `${shots}/proposals.png`, fullPage: true });

  // Status pages.
  await page.getByRole('link', { name: 'Status' }).click();
  await page.locator('tr[data-provider="gpt"] .yes').first().waitFor();
  await page.locator('tr[data-policy="incidents"] .spend-today').filter({ hasText: 'of $20.00' }).waitFor();
  await page.getByRole('cell', { name: 'get_incident_history' }).waitFor();
  await page.locator('tr[data-policy="incidents"] svg.spend rect').first().waitFor();
  await page.screenshot({ path: `${shots}/status.png`, fullPage: true });
  step('status pages: provider available, policy spend and chart, tools');

  // A phone-sized screen.
  const phone = await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true });
  await phone.addCookies(cookies);
  const small = await phone.newPage();
  small.on('request', (r) => { if (!r.url().startsWith(base)) foreign.push(r.url()); });
  await small.goto(sessionUrl);
  await small.locator('.msg.assistant', { hasText: firstWords }).waitFor();
  // Against 390, not innerWidth: a mobile layout viewport widens to fit what overflows.
  const width = await small.evaluate(() => document.documentElement.scrollWidth);
  assert.ok(width <= 390, `no horizontal scrolling on a phone (the page is ${width} px wide)`);
  await small.screenshot({ path: `${shots}/phone.png`, fullPage: true });
  await phone.close();
  step('phone layout without horizontal scrolling');

  // Sign out.
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.getByLabel('Token or API key').waitFor();
  const after = await page.evaluate(async () => (await fetch('/auth/v1/me')).status);
  assert.equal(after, 401, 'signed out');
  step('signed out');

  assert.deepEqual(foreign, [], 'no request left the Kortex origin');
  assert.deepEqual(problems, [], 'no script errors');
} finally {
  await browser.close();
}
