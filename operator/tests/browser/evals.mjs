// The dashboard's Evals page in headless Chromium: the recorded eval's row (configuration,
// passed/attempts, pass rate with its interval) and the pass-rate chart, with no serious or
// critical axe-core violation in light and dark. Run by operator/tests/it/evals.rs.
import assert from 'node:assert/strict';
import { axeViolations, launch } from './lib.mjs';

const base = process.env.KORTEX_URL;
const shots = process.env.SCREENSHOTS;
const browser = await launch();
const found = [];
try {
  for (const scheme of ['light', 'dark']) {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, colorScheme: scheme, bypassCSP: true });
    const page = await context.newPage();
    const problems = [];
    page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
    page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
    await page.goto(`${base}/#/chat`);
    await page.getByRole('link', { name: 'Evals' }).click();
    const row = page.locator('table.evals-table tr[data-label="scripted"]');
    await row.waitFor();
    const cells = await row.locator('td').allInnerTexts();
    assert.deepEqual(cells.slice(1, 5), ['scripted', 'suite', '1/4', '25% (5%–70%)'], cells.join(' | '));
    assert.equal(await page.locator('svg.eval-chart circle').count(), 1, 'one point on the chart');
    assert.match(await page.locator('svg.eval-chart').getAttribute('aria-label'), /scripted/);
    found.push(...await axeViolations(page, `${scheme} evals`));
    if (shots) await page.screenshot({ path: `${shots}/evals-${scheme}.png`, fullPage: true });
    assert.deepEqual(problems, [], problems.join('\n'));
    await context.close();
  }
  assert.deepEqual(found, [], `accessibility violations:\n${found.join('\n')}`);
  console.log('- the Evals page shows the recorded run, its chart, and passes axe-core in light and dark');
} finally {
  await browser.close();
}
