// What the dashboard's browser scripts share: Debian's Chromium started headless with
// nothing of its own on the network, and an axe-core scan of the page.
import { chromium } from 'playwright-core';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

/** Headless Chromium (`$CHROMIUM`), with no background traffic of its own. */
export function launch() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
}

let axeSource = null;

/**
 * The serious and critical WCAG 2.2 AA violations axe-core finds on the page, each as a
 * line naming `label`. The page's context needs `bypassCSP: true`: axe is injected as a
 * script, and the dashboard's CSP allows only its own.
 */
export async function axeViolations(page, label) {
  axeSource ??= readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');
  await page.addScriptTag({ content: axeSource });
  const result = await page.evaluate(() => window.axe.run(document, {
    runOnly: { type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'wcag22aa'] },
  }));
  return result.violations.filter((x) => x.impact === 'serious' || x.impact === 'critical')
    .map((v) => `${label}: ${v.id} (${v.impact}) ${v.help}: ${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join(' | ')}`);
}
