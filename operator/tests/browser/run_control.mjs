// Steers runs from the Kortex dashboard in headless Chromium: pause a run mid-step,
// redirect it while paused, resume it; approve a required plan with one step left out;
// ask a suggested follow-up question. Run by operator/tests/it/dashboard.rs.
import { launch } from './lib.mjs';
import assert from 'node:assert/strict';

const base = process.env.KORTEX_URL;
const browser = await launch();
const step = (s) => console.log(`- ${s}`);
try {
  const page = await (await browser.newContext({ viewport: { width: 1280, height: 860 } })).newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
  const open = async (name) => {
    await page.goto(`${base}/#/chat`);
    await page.getByLabel('New session').fill(name);
    await page.getByRole('button', { name: 'Create session' }).click();
    await page.getByRole('heading', { name }).waitFor();
  };
  const ask = async (text) => {
    await page.getByRole('textbox', { name: 'Message', exact: true }).fill(text);
    await page.getByRole('textbox', { name: 'Message', exact: true }).press('Enter');
  };

  // Pause mid-step, redirect while paused, resume.
  await open('incident-ui');
  await ask('Why is checkout slow?');
  await page.locator('#pause').waitFor();
  await page.locator('#pause').click();
  await page.locator('#session-status').filter({ hasText: /^paused$/ }).waitFor();
  await page.getByText('Paused: nothing is sent').waitFor();
  await page.locator('#resume').waitFor();
  step('paused from the dashboard');
  await page.getByLabel('Redirect the run').fill('look at the database instead');
  await page.locator('#rewind').selectOption({ label: 'rewind to step 1' });
  await page.getByRole('button', { name: 'Redirect', exact: true }).click();
  await page.getByText('Redirect kept').waitFor();
  await page.locator('#resume').click();
  await page.locator('.msg.assistant', { hasText: 'The database, as you said.' }).waitFor();
  await page.locator('#session-status').filter({ hasText: /^idle$/ }).waitFor();
  step('redirected while paused, resumed, answered');
  // Reloaded, the redirect is part of the stored transcript.
  await page.reload();
  await page.locator('.msg.user', { hasText: 'look at the database instead' }).waitFor();
  await page.screenshot({ path: `${process.env.SCREENSHOTS}/run-control.png`, fullPage: true });

  // A required plan: keep only step 2, approve.
  await open('planned-ui');
  await ask('Fix checkout');
  const plan = page.getByRole('article', { name: 'Plan' });
  await plan.waitFor();
  await page.locator('#session-status').filter({ hasText: 'awaiting_plan' }).waitFor();
  await plan.getByLabel('Keep step 1').uncheck();
  await page.screenshot({ path: `${process.env.SCREENSHOTS}/plan.png`, fullPage: true });
  await page.locator('#approve-plan').click();
  await page.locator('.msg.assistant', { hasText: 'Planned and done.' }).waitFor();
  step('plan approved with step 1 left out');
  // Suggested follow-ups: a click asks.
  const followUp = page.getByRole('button', { name: 'Is the database healthy?' });
  await followUp.waitFor();
  await followUp.click();
  await page.locator('.msg.user', { hasText: 'Is the database healthy?' }).waitFor();
  step('a follow-up chip asked its question');

  assert.deepEqual(problems, [], 'no script errors');
} finally {
  await browser.close();
}
