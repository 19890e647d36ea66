// Accessibility of the Kortex dashboard, in headless Chromium with axe-core: every screen —
// chat (with a Markdown answer), proposals, status, usage, the shortcuts dialog — in light
// and dark, with no serious or critical WCAG 2.2 AA violation. Screenshots of each.
// Run by operator/tests/it/dashboard.rs after the Markdown test has made a session.
import { chromium } from 'playwright-core';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const base = process.env.KORTEX_URL;
const shots = process.env.SCREENSHOTS;
const axeSource = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM,
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const found = [];
try {
  for (const scheme of ['light', 'dark']) {
    // axe is injected as a script: the page's CSP (script-src 'self') is bypassed for it.
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, colorScheme: scheme, bypassCSP: true });
    const page = await context.newPage();
    const scan = async (screen) => {
      await page.addScriptTag({ content: axeSource });
      const result = await page.evaluate(() => window.axe.run(document, {
        runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'wcag22aa'] },
      }));
      for (const v of result.violations.filter((x) => x.impact === 'serious' || x.impact === 'critical')) {
        found.push(`${scheme} ${screen}: ${v.id} (${v.impact}) ${v.help}: ${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join(' | ')}`);
      }
      if (shots) await page.screenshot({ path: `${shots}/${screen}-${scheme}.png`, fullPage: true });
    };
    await page.goto(`${base}/#/chat`);
    await page.locator('aside.sessions li a').first().click();
    await page.locator('.msg.assistant.md table').waitFor();
    await scan('chat');
    await page.locator('h2, h1').first().click();
    await page.keyboard.press('?');
    await page.getByRole('dialog', { name: 'Keyboard shortcuts' }).waitFor();
    await scan('shortcuts');
    await page.keyboard.press('Escape');
    await page.goto(`${base}/#/proposals`);
    await page.locator('main h2, main h1').first().waitFor();
    await scan('proposals');
    await page.goto(`${base}/#/status`);
    await page.locator('table').first().waitFor();
    await scan('status');
    await page.goto(`${base}/#/usage?since=30d&by=provider`);
    await page.locator('table.usage-table').waitFor();
    await scan('usage');
    await context.close();
    console.log(`- ${scheme}: chat, shortcuts, proposals, status and usage scanned`);
  }
  assert.deepEqual(found, [], `accessibility violations:\n${found.join('\n')}`);
} finally {
  await browser.close();
}
