// What the dashboard's browser scripts share: Debian's Chromium started headless with
// nothing of its own on the network, an axe-core scan of the page, and the small steps the
// scripts all take (problems gathered, light and dark, a tour of screens).
import assert from 'node:assert/strict';
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

/** `body(browser)` with a headless Chromium from [`launch`], closed after whatever happens. */
export async function withBrowser(body) {
  const browser = await launch();
  try {
    await body(browser);
  } finally {
    await browser.close();
  }
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

/** One line of a script's progress. */
export const step = (s) => console.log(`- ${s}`);

/**
 * Gathers the page's uncaught errors and its console errors into `problems` (and returns
 * it); a console error whose text `ignore` matches (an expected 4xx) is left out.
 */
export function watchProblems(page, problems = [], ignore = null) {
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && !ignore?.test(m.text())) problems.push(`console: ${m.text()}`);
  });
  return problems;
}

/**
 * `body(page, scheme)` on a new page in light and then in dark, each in its own context of
 * `viewport` that lets axe-core in (`bypassCSP`), closed after.
 */
export async function eachScheme(browser, viewport, body) {
  for (const scheme of ['light', 'dark']) {
    const context = await browser.newContext({ viewport, colorScheme: scheme, bypassCSP: true });
    await body(await context.newPage(), scheme);
    await context.close();
  }
}

/** Fails with every accessibility violation `found`. */
export function assertAccessible(found) {
  assert.deepEqual(found, [], `accessibility violations:\n${found.join('\n')}`);
}

/**
 * Visits each `[url, ready, label]` of `screens` in turn: goes to `url`, waits for
 * `ready(page)`, then calls `after(label)`.
 */
export async function tour(page, screens, after) {
  for (const [url, ready, label] of screens) {
    await page.goto(url);
    await ready(page);
    await after(label);
  }
}
