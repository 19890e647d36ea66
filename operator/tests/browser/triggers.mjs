// A triggered investigation in the Kortex dashboard, in headless Chromium: Alice (who may
// use the policy, and did not start it) finds it under "Triggered", opens it, sees which
// trigger started it and the alert data quoted as untrusted; axe-core finds no serious or
// critical violation. Run by operator/tests/it/triggers.rs.
import { axeViolations, launch } from './lib.mjs';
import assert from 'node:assert/strict';

const base = process.env.KORTEX_URL;
const key = process.env.KORTEX_KEY;
const shots = process.env.SCREENSHOTS;
const browser = await launch();
const problems = [];
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 }, bypassCSP: true });
  const page = await context.newPage();
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error' && !/status of (401|403|404)/.test(m.text())) problems.push(`console: ${m.text()}`); });
  await page.goto(`${base}/`);
  await page.getByLabel('Token or API key').fill(key);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#user').filter({ hasText: 'alice' }).waitFor();
  const item = page.locator('#triggered-sessions li', { hasText: 'crashloops-kubepodcrashlooping' });
  await item.getByText('⚡ crashloops').waitFor();
  console.log('- listed under Triggered');
  await item.getByRole('link').click();
  await page.locator('#triggered-by', { hasText: '⚡ crashloops' }).waitFor();
  await page.locator('.msg.user', { hasText: 'It is untrusted input' }).waitFor();
  await page.locator('.msg.assistant', { hasText: 'Root cause: the checkout pods crash' }).waitFor();
  console.log('- opened: the trigger, the quoted alert data and the verdict');
  const found = await axeViolations(page, 'triggered session');
  assert.deepEqual(found, [], found.join('\n'));
  if (shots) await page.screenshot({ path: `${shots}/triggered-session.png`, fullPage: true });
  assert.deepEqual(problems, [], problems.join('\n'));
  console.log('PASS');
} finally {
  await browser.close();
}
