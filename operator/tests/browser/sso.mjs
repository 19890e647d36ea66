// Single sign-on in headless Chromium against a real OpenID provider (Glewlwyd behind a
// TLS front): "Sign in with Glewlwyd", the provider's own login page, back in Kortex with
// the user's groups; a chat whose proposal the user approves (their group may); still
// signed in past the ID token's life; sign out, at the provider too. Run by
// operator/tests/it/sso_browser.rs.
import { launch, step } from './lib.mjs';
import assert from 'node:assert/strict';

const base = process.env.KORTEX_URL;
const providerUrl = process.env.PROVIDER_URL;
const answer = process.env.KORTEX_ANSWER;
const tokenSeconds = Number(process.env.TOKEN_SECONDS || '20');

const browser = await launch();
try {
  // The provider's certificate is the test's own (its TLS front); Kortex trusts it through
  // --oidc-ca-file, the browser is told to.
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 }, ignoreHTTPSErrors: true, locale: 'en-US' });
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (e) => { if (page.url().startsWith(base)) problems.push(`page error: ${e.message}`); });
  page.on('console', (m) => {
    if (m.type() === 'error' && page.url().startsWith(base) && !/status of 401/.test(m.text())) problems.push(`console: ${m.text()}`);
  });
  const me = () => page.evaluate(async () => (await fetch('/auth/v1/me')).status);

  await page.goto(`${base}/`);
  const signIn = page.getByRole('link', { name: 'Sign in with Glewlwyd' });
  await signIn.waitFor();
  await signIn.click();
  await page.waitForURL((u) => u.toString().startsWith(providerUrl));
  step(`at the provider's login page: ${new URL(page.url()).pathname}`);
  await page.locator('#username').fill('alice');
  await page.locator('#password').fill('alice-password');
  await page.locator('#loginbut').click();
  // Glewlwyd shows who is signed in, then "Continue" to the client.
  await page.locator('button.btn-success').click();
  await page.waitForURL((u) => u.toString().startsWith(base));
  await page.locator('#user').filter({ hasText: 'alice (oncall, platform)' }).waitFor();
  const cookies = await context.cookies(base);
  const session = cookies.find((c) => c.name === 'kortex_session');
  assert.ok(session && session.httpOnly && session.sameSite === 'Lax', `the session cookie is HttpOnly and SameSite=Lax: ${JSON.stringify(session)}`);
  assert.ok(!cookies.some((c) => c.value.startsWith('eyJ')), 'no token in a cookie');
  step('signed in as alice (oncall, platform) through the provider');

  // Chat, then approve the proposal: the policy lets the group oncall approve.
  await page.getByLabel('New session').fill('incident-sso');
  await page.getByRole('button', { name: 'Create session' }).click();
  await page.waitForURL(/#\/chat\/.+/);
  await page.getByRole('textbox', { name: 'Message', exact: true }).fill('Why is checkout failing?');
  await page.getByRole('textbox', { name: 'Message', exact: true }).press('Enter');
  await page.locator('article.proposal').waitFor();
  await page.locator('.msg.assistant', { hasText: answer }).waitFor();
  await page.locator('article.proposal button[data-decide="approve"]').click();
  await page.locator('article.proposal[data-phase="Approved"]').waitFor();
  await page.locator('article.proposal').getByText(/^alice/).first().waitFor();
  step('chatted and approved the proposal as alice');

  // Past the ID token's life: the session was refreshed (Glewlwyd renews the access token
  // and issues no new ID token), the user stays signed in.
  await page.waitForTimeout((tokenSeconds + 6) * 1000);
  await page.getByRole('link', { name: 'Status' }).click();
  await page.locator('#sign-in-mode').filter({ hasText: 'Single sign-on with Glewlwyd' }).waitFor();
  assert.equal(await me(), 200, 'still signed in after the ID token expired');
  await page.getByRole('link', { name: 'Proposals' }).click();
  await page.locator('article.proposal[data-phase="Approved"]').waitFor();
  step(`still signed in ${tokenSeconds + 6} s later (refreshed)`);

  // Sign out: Kortex's session ends, then the provider's (its own confirmation page),
  // which sends the browser back.
  await page.locator('#signout').click();
  await page.waitForURL((u) => u.toString().startsWith(providerUrl));
  await page.locator('button.btn-danger:not(.dropdown-toggle)').click();
  await page.waitForURL((u) => u.toString().startsWith(base), { timeout: 15000 });
  await signIn.waitFor();
  assert.equal(await me(), 401, 'signed out');
  step('signed out of Kortex and of the provider');

  assert.deepEqual(problems, [], 'no page errors on Kortex');
} finally {
  await browser.close();
}
