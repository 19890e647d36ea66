// Accessibility of the Kortex dashboard, in headless Chromium with axe-core: every screen —
// chat (with a Markdown answer), proposals, status, usage, the shortcuts dialog — in light
// and dark, with no serious or critical WCAG 2.2 AA violation; screenshots of each. On the
// chat screen, the keyboard: Tab walks header → sessions → conversation in reading order,
// each stop visibly focused, and reaches the message box.
// Run by operator/tests/it/dashboard.rs after the Markdown test has made a session.
import assert from 'node:assert/strict';
import { assertAccessible, axeViolations, eachScheme, tour, withBrowser } from './lib.mjs';

const base = process.env.KORTEX_URL;
const shots = process.env.SCREENSHOTS;
const found = [];
await withBrowser(async (browser) => {
  // axe is injected as a script: the page's CSP (script-src 'self') is bypassed for it.
  await eachScheme(browser, { width: 1280, height: 900 }, async (page, scheme) => {
    const scan = async (screen) => {
      found.push(...await axeViolations(page, `${scheme} ${screen}`));
      if (shots) await page.screenshot({ path: `${shots}/${screen}-${scheme}.png`, fullPage: true });
    };
    await page.goto(`${base}/#/chat`);
    await page.locator('aside.sessions li a').first().click();
    await page.locator('.msg.assistant.md table').waitFor();
    await scan('chat');
    if (scheme === 'light') await focusOrder(page);
    await page.locator('h2, h1').first().click();
    await page.keyboard.press('?');
    await page.getByRole('dialog', { name: 'Keyboard shortcuts' }).waitFor();
    await scan('shortcuts');
    await page.keyboard.press('Escape');
    await tour(page, [
      [`${base}/#/proposals`, (p) => p.locator('main h2, main h1').first().waitFor(), 'proposals'],
      [`${base}/#/status`, (p) => p.locator('table').first().waitFor(), 'status'],
      [`${base}/#/usage?since=30d&by=provider`, (p) => p.locator('table.usage-table').waitFor(), 'usage'],
    ], scan);
    console.log(`- ${scheme}: chat, shortcuts, proposals, status and usage scanned`);
  });
  assertAccessible(found);
});

/** Tab from the first link of the page to the message box: the order and the focus ring. */
async function focusOrder(page) {
  assert.equal(await page.locator('[tabindex]:not([tabindex="0"]):not([tabindex="-1"])').count(), 0,
    'no positive tabindex reorders the page');
  await page.locator('header a.brand').focus();
  const regions = ['header', 'sessions', 'conversation'];
  const stops = [];
  for (let i = 0; i < 80; i += 1) {
    await page.keyboard.press('Tab');
    const stop = await page.evaluate(() => {
      const el = document.activeElement;
      const style = getComputedStyle(el);
      const box = el.getBoundingClientRect();
      return {
        region: el.closest('header') ? 'header' : el.closest('aside.sessions') ? 'sessions'
          : el.closest('.conversation') ? 'conversation' : `outside (${el.tagName})`,
        name: el.getAttribute('aria-label') || el.id || (el.textContent || '').trim().slice(0, 30) || el.tagName,
        ring: style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) >= 2,
        shown: box.width > 0 && box.height > 0,
      };
    });
    stops.push(stop);
    if (stop.name === 'Message') break;
  }
  const walk = stops.map((s) => `${s.region}:${s.name}`).join(' → ');
  assert.equal(stops.at(-1).name, 'Message', `Tab reaches the message box: ${walk}`);
  for (const s of stops) {
    assert.ok(regions.includes(s.region), `a stop in reading order only: ${s.region} ${s.name}`);
    assert.ok(s.ring, `a visible focus ring on ${s.region}:${s.name}`);
    assert.ok(s.shown, `a focused element is on screen: ${s.region}:${s.name}`);
  }
  const order = stops.map((s) => regions.indexOf(s.region));
  assert.ok(order.every((r, i) => i === 0 || r >= order[i - 1]), `header, then sessions, then conversation: ${walk}`);
  for (const name of ['Chat', 'new-session-name', 'Search sessions']) {
    assert.ok(stops.some((s) => s.name === name || s.name.startsWith(name)), `Tab reaches ${name}: ${walk}`);
  }
  console.log(`- focus order: ${stops.length} stops, each with a focus ring`);
}
