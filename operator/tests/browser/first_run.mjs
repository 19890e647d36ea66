// A newcomer's first run in headless Chromium: with no provider reachable, the first screen
// (no session open) and the session's chat screen show the banner with the fix before
// anything is asked (no serious axe-core violation);
// once the test makes the local model reachable, the banner goes by itself and a question
// is answered. Run by operator/tests/it/first_run.rs, which waits for $SEEN to exist
// before making the provider reachable.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { axeViolations, launch } from './lib.mjs';

const base = process.env.KORTEX_URL;
const shots = process.env.SCREENSHOTS;
const browser = await launch();
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, bypassCSP: true });
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  // The first screen, no session open: the banner is there already.
  await page.goto(`${base}/#/chat`);
  const landing = page.locator('#route-banner');
  await landing.waitFor({ state: 'visible', timeout: 15000 });
  const said = await landing.innerText();
  assert.match(said, /No model can answer right now/);
  assert.match(said, /start Ollama at http:\/\/127\.0\.0\.1:\d+ \(`ollama serve`\) and `ollama pull qwen3:4b`/);
  assert.match(said, /set ANTHROPIC_API_KEY or OPENAI_API_KEY/);
  assert.equal(await landing.getByRole('link', { name: 'Status page' }).getAttribute('href'), '#/status');
  const onLanding = await axeViolations(page, 'landing banner');
  assert.deepEqual(onLanding, [], onLanding.join('\n'));
  if (shots) await page.screenshot({ path: `${shots}/no-provider-landing.png`, fullPage: true });
  console.log('- the landing page says no model can answer, and what to do');
  await page.goto(`${base}/#/chat/${process.env.SESSION}`);
  const banner = page.locator('#route-banner');
  await banner.waitFor({ state: 'visible', timeout: 15000 });
  const text = await banner.innerText();
  assert.match(text, /No model can answer in this session right now/);
  assert.match(text, /start Ollama at http:\/\/127\.0\.0\.1:\d+ \(`ollama serve`\) and `ollama pull qwen3:4b`/);
  assert.match(text, /set ANTHROPIC_API_KEY or OPENAI_API_KEY/);
  assert.ok(!text.includes('os error'), `no transport detail: ${text}`);
  assert.equal(await banner.getByRole('link', { name: 'Status page' }).getAttribute('href'), '#/status');
  // The question asked before (it failed) says why, read back from the database.
  await page.locator('.note.error', { hasText: 'Failed: No provider of ChatPolicy default can answer now' }).waitFor();
  const found = await axeViolations(page, 'banner');
  assert.deepEqual(found, [], found.join('\n'));
  if (shots) await page.screenshot({ path: `${shots}/no-provider.png`, fullPage: true });
  console.log('- the banner says what to do before anything is asked');
  writeFileSync(process.env.SEEN, 'seen');
  await banner.waitFor({ state: 'hidden', timeout: 30000 });
  console.log('- the banner went once the model was reachable');
  await page.getByRole('textbox', { name: 'Message', exact: true }).fill('Hello?');
  await page.getByRole('textbox', { name: 'Message', exact: true }).press('Enter');
  await page.locator('.msg.assistant', { hasText: 'Hello from Ollama.' }).waitFor({ timeout: 20000 });
  console.log('- the question is answered');
  // Back on the first screen: nothing to warn about.
  const checked = page.waitForResponse((r) => r.url().endsWith('/chat/v1/route'));
  await page.goto(`${base}/#/chat`);
  await checked;
  await page.getByLabel('New session').waitFor();
  assert.equal(await page.locator('#route-banner:visible').count(), 0, 'no banner once a model can answer');
  console.log('- the landing page has no banner once a model can answer');
  assert.deepEqual(problems, [], problems.join('\n'));
} finally {
  await browser.close();
}
