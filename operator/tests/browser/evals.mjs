// The dashboard's Evals page in headless Chromium: the recorded eval's row (configuration,
// passed/attempts, pass rate with its interval) and the pass-rate chart, with no serious or
// critical axe-core violation in light and dark. Run by operator/tests/it/evals.rs.
import assert from 'node:assert/strict';
import { assertAccessible, axeViolations, eachScheme, withBrowser, watchProblems } from './lib.mjs';

const base = process.env.KORTEX_URL;
const shots = process.env.SCREENSHOTS;
const found = [];
await withBrowser(async (browser) => {
  await eachScheme(browser, { width: 1280, height: 900 }, async (page, scheme) => {
    const problems = watchProblems(page);
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
  });
  assertAccessible(found);
  console.log('- the Evals page shows the recorded run, its chart, and passes axe-core in light and dark');
});
